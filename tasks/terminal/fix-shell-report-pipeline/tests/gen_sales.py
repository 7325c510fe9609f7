"""Generate a directory of sales CSV files: python3 gen_sales.py DIR SEED"""
import os
import random
import sys

STORES = ["Harbour St", "Mill Lane", "North Gate", "Quayside", "West End", "Old Town", "Riverside"]


def build(root, seed):
    """Write the data set under ``root``; return what was written, ``{relative path: text}``."""
    written = {}
    rnd = random.Random(seed)
    stores = rnd.sample(STORES, rnd.randint(4, len(STORES)))
    skus = [f"SKU-{rnd.randint(100, 999)}" for _ in range(rnd.randint(6, 12))]
    price = {s: rnd.randint(99, 250000) for s in skus}  # cents; some very expensive
    layout = ["jan.csv", "feb.csv", "march sales.csv", "q2/apr.csv", "q2/may final.csv",
              "archive 2023/dec.csv", "q2/notes.txt", "empty.csv"]
    for i, rel in enumerate(layout):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if rel.endswith(".txt"):
            with open(path, "w") as f:
                f.write("date,store,qty,price,sku\n2024-01-01,Ghost,1,1.00,SKU-000\n")
            written[rel] = "date,store,qty,price,sku\n2024-01-01,Ghost,1,1.00,SKU-000\n"
            continue
        n = 0 if rel == "empty.csv" else rnd.randint(15, 60)
        lines = ["date,store,qty,price,sku"]
        for _ in range(n):
            s = rnd.choice(skus)
            lines.append(f"2024-{i + 1:02d}-{rnd.randint(1, 28):02d},{rnd.choice(stores)},{rnd.randint(1, 40)},"
                         f"{price[s] // 100}.{price[s] % 100:02d},{s}")
        eol = "\r\n" if i % 3 == 1 else "\n"
        text = eol.join(lines)
        if i % 2 == 0 or n == 0:
            text += eol
        with open(path, "w", newline="") as f:
            f.write(text)
        written[rel] = text
    return written


if __name__ == "__main__":
    build(sys.argv[1], int(sys.argv[2]))
