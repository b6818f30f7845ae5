"""Training of the trained predictors (acceptance heads, decision models): data generation and training loops.
Runtime code never imports this package; the predictors themselves live in `multispec.heads`."""
