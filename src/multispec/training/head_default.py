"""The draft shape a head `train-head` made records as its default (config.json "default": what `eagle` drafts
when given no k, tree or nodes; models/eagle_io.head_default).

A head's best chain length depends on how well it learned: the shipped SmolLM2 head is fastest at k = 2 (1.46x
`ar`), while a 30-minute CPU head (held-out alpha 0.43) ran eagle's fallback k = 4 at 0.63x `ar` and k = 1 at
1.27x. So the chain lengths are timed at the end of training, greedy, on prompts cut from the held-out chunks
(never trained on), interleaved one prompt at a time, and the fastest is recorded with the figures it won by.
"""
from __future__ import annotations

import time

import torch

CHAINS = (1, 2, 3, 4)
PROMPT_TOKENS = 48  # the opening of a held-out chunk a timed run continues
NEW_TOKENS = 32


def pick_default(pair, head_dir: str, held: torch.Tensor, seconds: float, log) -> dict:
    """{"k": the fastest chain length, "measured": the figures} for the head saved in head_dir: `ar` and eagle at
    each of CHAINS decode the openings of the held-out chunks `held` (token ids [m, L]) one prompt after another,
    every method on the same prompt in turn, until `seconds` have passed (at least one prompt; each method warmed
    first, untimed)."""
    from multispec.decoding.decoder import Decoder
    from multispec.sampling import SamplingConfig

    greedy = SamplingConfig(temperature=0.0)
    decoders = {"ar": Decoder(pair, "ar")}  # (each on the backend a run takes by default: fast where there is one)
    first = Decoder(pair, "eagle", head=head_dir, k=CHAINS[0])  # the head read once, shared by the others
    decoders.update({f"k={k}": first if k == CHAINS[0] else Decoder(pair, "eagle", head=head_dir, k=k,
                                                                     loaded=first.loaded) for k in CHAINS})
    prompts = [row[:PROMPT_TOKENS].tolist() for row in held]
    for d in decoders.values():
        d.run(prompts[0][:8], greedy, 4, 0)
    spent = {name: 0.0 for name in decoders}
    made = {name: 0 for name in decoders}
    end, n = time.monotonic() + seconds, 0
    for ids in prompts:
        if n and time.monotonic() >= end:
            break
        for name, d in decoders.items():
            t = time.perf_counter()
            new, _ = d.run(ids, greedy, NEW_TOKENS, 0)
            spent[name] += time.perf_counter() - t
            made[name] += len(new)
        n += 1
    rate = {name: made[name] / max(spent[name], 1e-9) for name in decoders}
    best = max(CHAINS, key=lambda k: rate[f"k={k}"])
    figures = ", ".join(f"k = {k} {rate[f'k={k}'] / rate['ar']:.2f}x" for k in CHAINS)
    measured = (f"train-head: eagle against ar, greedy, {n} held-out prompts x {NEW_TOKENS} tokens, "
                f"{torch.get_num_threads()} thread(s) on {pair.device.type}: {figures}")
    log(f"default draft: k = {best} ({measured})")
    if rate[f"k={best}"] < rate["ar"]:
        log("this head does not pay yet on this machine (eagle is slower than ar at every k): train it longer "
            "(--resume), or let auto decide when to draft with it")
    return {"k": best, "measured": measured}
