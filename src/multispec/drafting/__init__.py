"""Proposers (tree growth with the draft model) and the policies that choose how far to draft."""
