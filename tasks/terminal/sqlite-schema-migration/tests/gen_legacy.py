"""Generate a legacy (denormalised) order database: python3 gen_legacy.py OUT.db SEED"""
import datetime
import random
import sqlite3
import sys


def build(path, seed):
    """Write the database at ``path``; return the rows inserted into orders_flat, in order."""
    written = []
    rnd = random.Random(seed)
    con = sqlite3.connect(path)
    con.execute("""CREATE TABLE orders_flat (
        order_no TEXT, order_date TEXT, customer_email TEXT, customer_name TEXT, customer_city TEXT,
        item_sku TEXT, item_name TEXT, item_price TEXT, qty INTEGER)""")
    people = []
    for i in range(rnd.randint(12, 18)):
        first = rnd.choice(["Ana", "Bert", "Caro", "Dirk", "Elif", "Finn", "Gina", "Hugo", "Iris", "Jan"])
        last = rnd.choice(["Meyer", "Kaya", "Novak", "Smit", "Lund", "Rossi"])
        people.append((f"{first.lower()}.{last.lower()}{i}@example.com", f"{first} {last}", rnd.choice(["Bremen", "Graz", "Basel", None])))
    products = [(f"P-{100 + k}", f"Widget {chr(65 + k)}", rnd.randint(50, 9999)) for k in range(rnd.randint(8, 12))]
    day = datetime.date(2023, 1, 1)
    for n in range(rnd.randint(60, 80)):
        day += datetime.timedelta(days=rnd.randint(0, 6))
        email, name, city = rnd.choice(people)
        shown_email = rnd.choice([email, email.upper(), " " + email, email.capitalize() + " "])
        shown_name = name if rnd.random() < 0.8 else name.split()[0] + " " + name.split()[1].upper()
        order_no = f"SO-{seed}{n:04d}"
        lines = rnd.sample(products, rnd.randint(1, 4))
        for sku, pname, cents in lines:
            price = cents if rnd.random() < 0.85 else cents + rnd.choice([-25, 100, 250])
            text = rnd.choice([f"{price // 100}.{price % 100:02d}", f"€{price // 100}.{price % 100:02d}",
                               f"{price // 100},{price % 100:02d}", f" {price / 100:.2f} "])
            qty = rnd.randint(1, 5)
            rows = [(order_no, day.isoformat(), shown_email, shown_name, city, sku, pname, text, qty)]
            if rnd.random() < 0.08:  # the same line exported twice (split shipment)
                rows.append((order_no, day.isoformat(), shown_email, shown_name, city, sku, pname, text, rnd.randint(1, 3)))
            con.executemany("INSERT INTO orders_flat VALUES (?,?,?,?,?,?,?,?,?)", rows)
            written.extend(rows)
    con.commit()
    con.close()
    return written


if __name__ == "__main__":
    build(sys.argv[1], int(sys.argv[2]))
