#!/bin/bash
set -euo pipefail
cat > /app/migrate.sql <<'SQL'
PRAGMA foreign_keys = ON;
BEGIN;

CREATE TEMP TABLE flat AS
SELECT order_no,
       order_date,
       lower(trim(customer_email)) AS email,
       trim(customer_name) AS name,
       customer_city AS city,
       item_sku AS sku,
       item_name AS pname,
       CAST(round(CAST(replace(replace(trim(item_price), '€', ''), ',', '.') AS REAL) * 100) AS INTEGER) AS cents,
       qty
FROM orders_flat;

CREATE TABLE customers (
  id INTEGER PRIMARY KEY,
  email TEXT NOT NULL UNIQUE,
  name TEXT NOT NULL,
  city TEXT
);
INSERT INTO customers (id, email, name, city)
SELECT ROW_NUMBER() OVER (ORDER BY email), email, name, city
FROM (SELECT email, name, city,
             ROW_NUMBER() OVER (PARTITION BY email ORDER BY order_date DESC, order_no DESC) AS rn
      FROM flat)
WHERE rn = 1;

CREATE TABLE products (
  sku TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  price_cents INTEGER NOT NULL
);
INSERT INTO products (sku, name, price_cents)
SELECT sku, pname, cents
FROM (SELECT sku, pname, cents,
             ROW_NUMBER() OVER (PARTITION BY sku ORDER BY order_date DESC, order_no DESC) AS rn
      FROM flat)
WHERE rn = 1;

CREATE TABLE orders (
  order_no TEXT PRIMARY KEY,
  customer_id INTEGER NOT NULL REFERENCES customers(id),
  order_date TEXT NOT NULL
);
INSERT INTO orders (order_no, customer_id, order_date)
SELECT DISTINCT f.order_no, c.id, f.order_date
FROM flat f JOIN customers c ON c.email = f.email;

CREATE TABLE order_items (
  order_no TEXT NOT NULL REFERENCES orders(order_no),
  sku TEXT NOT NULL REFERENCES products(sku),
  qty INTEGER NOT NULL,
  unit_price_cents INTEGER NOT NULL,
  PRIMARY KEY (order_no, sku)
);
INSERT INTO order_items (order_no, sku, qty, unit_price_cents)
SELECT order_no, sku, SUM(qty), MAX(cents)
FROM flat GROUP BY order_no, sku;

CREATE VIEW order_totals (order_no, total_cents) AS
SELECT order_no, SUM(qty * unit_price_cents) FROM order_items GROUP BY order_no;

DROP TABLE orders_flat;
DROP TABLE flat;
COMMIT;
SQL
