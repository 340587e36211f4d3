"""A product catalog generated in WebShop's own JSON formats, for machines without WebShop's data (its files are on
Google Drive) and for the tests::

    python -m actfirst.envs.webshop.catalog --products 1000 --out <WebShop>/data/generated-1000 [--seed 0]

writes the three files WebShop reads, in the formats its loader (``web_agent_site.engine.engine.load_products``)
and goal builder (``web_agent_site.engine.goal.get_human_goals``) read:

- ``items_shuffle.json``: a list of products (``asin``, ``name``, ``full_description``, ``small_description``,
  ``pricing`` as ``"$12.99"`` or ``"$10.99 - $15.99"``, ``customization_options`` as option name -> list of
  ``{"value", "image"}``, ``images``, ``category``, ``query``, ``product_category`` with " › " between levels, and
  the keys the loader drops);
- ``items_ins_v2.json``: asin -> ``{"attributes": [...], "instruction": ..., "instruction_attributes": [...]}``;
- ``items_human_ins.json``: asin -> a list of ``{"asin", "instruction", "instruction_attributes",
  "instruction_options"}``, the goals (about two per product for two thirds of the products).

Products are drawn from WebShop's five categories with types, attributes and options of each; a goal names its
product's type, one to three of its attributes and one value of each of its options, so WebShop's reward scores a
purchase of another product partially. Deterministic for a seed. It is not WebShop's catalog: a run on it measures
the simulator and the pipeline, not the paper's numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
from pathlib import Path

from actfirst.core.user_input import check_writable_dir, command, positive_int

PRODUCTS_FILE = "items_shuffle.json"
ATTRIBUTES_FILE = "items_ins_v2.json"
GOALS_FILE = "items_human_ins.json"

_CATEGORIES = {
    "fashion": ("Clothing, Shoes & Jewelry", ["hoodie", "t-shirt", "dress", "jacket", "sneakers", "jeans", "sweater",
                                              "leggings", "sandals", "boots"],
                ["machine wash", "long sleeve", "slim fit", "button closure", "polyester cotton", "elastic waistband",
                 "rubber sole", "daily wear", "relaxed fit", "quality materials"],
                {"color": ["black", "white", "navy blue", "heather grey", "burgundy", "olive green", "pink"],
                 "size": ["small", "medium", "large", "x-large", "xx-large"]}),
    "beauty": ("Beauty & Personal Care", ["shampoo", "lipstick", "face serum", "hair mask", "nail polish",
                                          "body lotion", "eyeshadow palette", "perfume"],
               ["paraben free", "cruelty free", "long lasting", "natural ingredients", "sulfate free", "travel size",
                "dry skin", "easy apply", "fine lines", "sensitive skin"],
               {"scent": ["lavender", "vanilla", "citrus", "unscented", "rose"],
                "size": ["2 fl oz (pack of 1)", "8 fl oz (pack of 1)", "8 fl oz (pack of 2)", "16 fl oz"]}),
    "electronics": ("Electronics", ["bluetooth speaker", "usb cable", "wireless earbuds", "phone case", "hdmi cable",
                                    "power bank", "watch band", "webcam"],
                    ["high speed", "fast charging", "noise cancelling", "easy install", "water resistant",
                     "plug and play", "high definition", "long battery life", "aluminum alloy", "hands free"],
                    {"color": ["black", "white", "silver", "blue", "red"],
                     "size": ["3 ft", "6 ft", "10 ft", "1 pack", "2 pack"]}),
    "food": ("Grocery & Gourmet Food", ["protein bar", "green tea", "coffee beans", "dark chocolate", "trail mix",
                                        "beef jerky", "olive oil", "granola"],
             ["gluten free", "non gmo", "low sugar", "keto friendly", "sugar free", "high protein", "plant based",
              "usda organic", "low carb", "individually wrapped"],
             {"flavor name": ["vanilla", "chocolate", "peanut butter", "original", "sea salt", "mixed berry"],
              "size": ["12 count (pack of 1)", "12 count (pack of 2)", "16 ounce", "2 pound"]}),
    "furniture": ("Home & Kitchen", ["office chair", "bookshelf", "coffee table", "bed frame", "nightstand", "ottoman",
                                     "tv stand", "dining chair"],
                  ["easy assemble", "space saving", "solid wood", "storage space", "living room", "engineered wood",
                   "heavy duty", "height adjustable", "metal legs", "mid century"],
                  {"color": ["walnut", "white", "black", "grey", "natural", "espresso"],
                   "size": ["twin", "full", "queen", "king", "small", "large"]}),
}
_BRAND_SYLLABLES = ["lu", "mo", "ra", "ve", "ta", "ki", "no", "sa", "ze", "pi", "do", "cor", "bel", "an", "tri"]
_AUDIENCE = ["for women", "for men", "for kids", "for home", "for travel", "for office", "for everyday use", "unisex"]
_PRICES = [4.99, 7.49, 9.99, 12.99, 15.99, 19.99, 24.99, 29.99, 34.99, 39.99, 49.99, 59.99, 79.99, 99.99, 149.99]
_GOAL_OPENINGS = ["i am looking for", "i need", "i want to buy", "find me", "i would like", "im looking for"]


def _asin(rng: random.Random, taken: set[str]) -> str:
    """A 10-character id as WebShop's are ("B0" and 8 of A-Z0-9); unique in ``taken``."""
    while True:
        asin = "B0" + "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _pricing(rng: random.Random) -> str:
    low = rng.choice(_PRICES)
    if rng.random() < 0.2:
        return f"${low} - ${round(low * rng.uniform(1.2, 2.0), 2)}"
    return f"${low}"


def _product(rng: random.Random, asin: str, category: str) -> tuple[dict, list[str]]:
    """One product in ``items_shuffle.json``'s format and its attributes."""
    top, types, attributes, options = _CATEGORIES[category]
    kind = rng.choice(types)
    brand = "".join(rng.choices(_BRAND_SYLLABLES, k=rng.randint(2, 3))).capitalize()
    own = rng.sample(attributes, rng.randint(2, 4))
    name = f"{brand} {' '.join(a.title() for a in own[:2])} {kind.title()} {rng.choice(_AUDIENCE)}"
    chosen = {n: rng.sample(v, rng.randint(2, min(4, len(v)))) for n, v in options.items() if rng.random() < 0.8}
    product = {
        "asin": asin, "name": name, "category": category, "query": kind,
        "product_category": f"{top} › {category.title()} › {kind.title()}",
        "full_description": f"This {kind} by {brand} is {', '.join(own)}. " + rng.choice(
            ["Backed by a 30-day return policy.", "Ships in recyclable packaging.", "Designed and tested by us."]),
        "small_description": [f"{a.capitalize()}: made for people who care about {a}" for a in own],
        "pricing": _pricing(rng),
        "customization_options": {n.title(): [{"value": v.title(), "image": None} for v in values]
                                  for n, values in chosen.items()} or None,
        "images": [f"https://example.com/images/{asin}.jpg"],
        "brand": brand, "product_information": {}, "average_rating": None, "total_reviews": 0,
    }
    return product, own


def _goal(rng: random.Random, product: dict, attributes: list[str]) -> dict:
    """A goal of ``items_human_ins.json``: the product's type, some of its attributes, one value of each option."""
    kind = product["query"]
    wanted = rng.sample(attributes, rng.randint(1, min(3, len(attributes))))
    values = [rng.choice(choices)["value"].lower() for choices in (product["customization_options"] or {}).values()]
    text = f"{rng.choice(_GOAL_OPENINGS)} a {wanted[0]} {kind}"
    if len(wanted) > 1:
        text += " that is " + " and ".join(wanted[1:])
    if values:
        text += f", in {' and '.join(values)}"
    return {"asin": product["asin"], "instruction": text, "instruction_attributes": wanted,
            "instruction_options": values}


def generate_catalog(products: int, seed: int = 0) -> tuple[list[dict], dict, dict]:
    """``products`` products, their attributes and goals, in WebShop's formats (the three files' contents)."""
    rng, taken = random.Random(seed), set()
    items, attributes, goals = [], {}, {}
    for _ in range(products):
        product, own = _product(rng, _asin(rng, taken), rng.choice(sorted(_CATEGORIES)))
        items.append(product)
        first = _goal(rng, product, own)
        attributes[product["asin"]] = {"attributes": own, "instruction": first["instruction"],
                                       "instruction_attributes": first["instruction_attributes"]}
        if rng.random() < 2 / 3:
            goals[product["asin"]] = [first] + [_goal(rng, product, own) for _ in range(rng.randint(0, 2))]
    return items, attributes, goals


def write_catalog(out: Path, products: int, seed: int = 0) -> dict[str, Path]:
    """Write the three files into ``out`` (each atomically: written beside, then renamed); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, content in zip((PRODUCTS_FILE, ATTRIBUTES_FILE, GOALS_FILE), generate_catalog(products, seed),
                             strict=True):
        tmp = out / f".{name}.tmp"
        tmp.write_text(json.dumps(content))
        tmp.replace(out / name)
        paths[name] = out / name
    return paths


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actfirst.envs.webshop.catalog", description=__doc__.split("\n")[0])
    parser.add_argument("--products", type=positive_int, required=True)
    parser.add_argument("--out", required=True, help="the folder for the three files (created)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    check_writable_dir(out, "--out")
    paths = write_catalog(out, args.products, args.seed)
    goals = sum(len(g) for g in json.loads(paths[GOALS_FILE].read_text()).values())
    print(f"catalog: {args.products} products, {goals} goal instructions in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
