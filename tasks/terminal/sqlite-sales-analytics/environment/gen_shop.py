"""Deterministically generate the shop database: python3 gen_shop.py OUT.db SEED"""
import random
import sqlite3
import sys


def build(path, seed):
    rnd = random.Random(seed)
    con = sqlite3.connect(path)
    con.executescript("""
    CREATE TABLE customers (customer_id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, created_at TEXT NOT NULL);
    CREATE TABLE products (product_id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, list_price REAL NOT NULL);
    CREATE TABLE orders (order_id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(customer_id),
                         ordered_at TEXT NOT NULL, status TEXT NOT NULL CHECK (status IN ('completed','cancelled','pending')));
    CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(order_id), product_id INTEGER NOT NULL REFERENCES products(product_id),
                              qty INTEGER NOT NULL, unit_price REAL NOT NULL, PRIMARY KEY (order_id, product_id));
    """)
    first = ["Ava", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gil", "Hal", "Ivy", "Jay", "Kai", "Liv", "Moe", "Nia", "Oli"]
    last = ["Stone", "Reed", "Park", "Quinn", "Shah", "Long", "Marsh", "Ng", "Ortiz", "Price"]
    cities = ["Leeds", "York", "Bath", "Hull", None]
    ncust = rnd.randint(35, 45)
    for cid in range(1, ncust + 1):
        con.execute("INSERT INTO customers VALUES (?,?,?,?)",
                    (cid, f"{rnd.choice(first)} {rnd.choice(last)}", rnd.choice(cities),
                     f"2023-{rnd.randint(1, 12):02d}-{rnd.randint(1, 28):02d}"))
    cats = ["tools", "garden", "kitchen", "toys"]
    nprod = rnd.randint(25, 32)
    for pid in range(1, nprod + 1):
        con.execute("INSERT INTO products VALUES (?,?,?,?)",
                    (pid, f"Product {pid:03d}", rnd.choice(cats), round(rnd.uniform(2, 150), 2)))
    prices = dict(con.execute("SELECT product_id, list_price FROM products"))
    sellable = list(range(1, nprod + 1))
    rnd.shuffle(sellable)
    never = set(sellable[:4])  # never in any order
    only_cancelled = set(sellable[4:6])  # only in cancelled/pending orders
    active = [c for c in range(1, ncust + 1) if rnd.random() < 0.85]
    oid = 0
    for _ in range(rnd.randint(180, 220)):
        oid += 1
        cid = rnd.choice(active)
        status = rnd.choices(["completed", "cancelled", "pending"], [80, 12, 8])[0]
        ts = f"2024-{rnd.randint(1, 9):02d}-{rnd.randint(1, 28):02d} {rnd.randint(0, 23):02d}:{rnd.randint(0, 59):02d}:{rnd.randint(0, 59):02d}"
        con.execute("INSERT INTO orders VALUES (?,?,?,?)", (oid, cid, ts, status))
        pool = [p for p in range(1, nprod + 1) if p not in never and (status != "completed" or p not in only_cancelled)]
        for pid in rnd.sample(pool, rnd.randint(1, 4)):
            price = prices[pid] if rnd.random() < 0.8 else round(prices[pid] * rnd.choice([0.9, 0.75]), 2)
            con.execute("INSERT INTO order_items VALUES (?,?,?,?)", (oid, pid, rnd.randint(1, 6), price))
    con.commit()
    con.close()


if __name__ == "__main__":
    build(sys.argv[1], int(sys.argv[2]))
