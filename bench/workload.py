"""Deterministic workloads: topical texts with a long-tailed length mix.

Many short texts, a few very long ones (a Pareto number of sentences), each
about one topic, so nearest neighbours are meaningful in the demo.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "pets": (["the cat", "a kitten", "our dog", "the puppy", "a small hamster", "my parrot"],
             ["sleeps on", "plays with", "chases", "curls up beside", "purrs next to",
              "sniffs"],
             ["the warm rug", "a ball of yarn", "the sofa", "its food bowl", "the garden fence",
              "a cardboard box"]),
    "markets": (["the stock market", "bond yields", "the central bank", "tech shares",
                 "oil prices", "the currency"],
                ["fell sharply after", "rallied on", "reacted to", "slipped ahead of",
                 "surged following", "stayed flat despite"],
                ["the inflation report", "the rate decision", "weak earnings",
                 "the jobs data", "trade tensions", "quarterly results"]),
    "cooking": (["the chef", "my grandmother", "the baker", "a home cook", "the recipe",
                 "the kitchen team"],
                ["slowly simmers", "kneads", "roasts", "seasons", "whisks", "bakes"],
                ["the tomato sauce", "fresh bread dough", "a whole chicken", "the vegetables",
                 "the eggs and cream", "a lemon tart"]),
    "football": (["the striker", "the home team", "the goalkeeper", "the coach",
                  "the midfielder", "the visiting side"],
                 ["scored against", "defended well against", "celebrated beating",
                  "trained hard before", "lost narrowly to", "drew with"],
                 ["the league leaders", "their local rivals", "the champions",
                  "a strong defence", "the cup holders", "a penalty shootout"]),
    "space": (["the telescope", "the rover", "astronomers", "the space station",
               "a distant galaxy", "the probe"],
              ["observed", "photographed", "orbited", "measured", "detected", "approached"],
              ["a faint exoplanet", "the red surface of Mars", "a bright supernova",
               "the rings of Saturn", "dark matter signals", "an icy comet"]),
}


def sentence(rng: random.Random, topic: str) -> str:
    subj, verb, obj = TOPICS[topic]
    return f"{rng.choice(subj).capitalize()} {rng.choice(verb)} {rng.choice(obj)}."


def texts(n: int, seed: int = 0, max_sentences: int = 24) -> list[tuple[str, str]]:
    """(topic, text) pairs; sentence counts follow a Pareto tail (mean ~2, max 24)."""
    rng = random.Random(seed)
    names = sorted(TOPICS)
    out = []
    for _ in range(n):
        topic = rng.choice(names)
        k = min(max_sentences, int(rng.paretovariate(1.3)))
        out.append((topic, " ".join(sentence(rng, topic) for _ in range(max(1, k)))))
    return out


def write_embeddings_jsonl(path: Path, items: list[tuple[str, str]],
                           model: str = "all-MiniLM-L6-v2") -> None:
    with path.open("w") as f:
        for i, (_, text) in enumerate(items):
            f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST",
                                "url": "/v1/embeddings",
                                "body": {"model": model, "input": text}}) + "\n")
