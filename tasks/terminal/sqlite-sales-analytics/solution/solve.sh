#!/bin/bash
set -euo pipefail
mkdir -p /app/queries
cat > /app/queries/q1_top_customers.sql <<'SQL'
SELECT c.customer_id, c.name, ROUND(SUM(oi.qty * oi.unit_price), 2) AS total_spent
FROM customers c
JOIN orders o ON o.customer_id = c.customer_id AND o.status = 'completed'
JOIN order_items oi ON oi.order_id = o.order_id
GROUP BY c.customer_id, c.name
ORDER BY SUM(oi.qty * oi.unit_price) DESC, c.customer_id ASC
LIMIT 5;
SQL
cat > /app/queries/q2_monthly_revenue.sql <<'SQL'
WITH per_order AS (
  SELECT o.order_id, substr(o.ordered_at, 1, 7) AS month, SUM(oi.qty * oi.unit_price) AS value
  FROM orders o JOIN order_items oi ON oi.order_id = o.order_id
  WHERE o.status = 'completed'
  GROUP BY o.order_id
)
SELECT month, COUNT(*) AS orders, ROUND(SUM(value), 2) AS revenue
FROM per_order GROUP BY month ORDER BY month;
SQL
cat > /app/queries/q3_unsold_products.sql <<'SQL'
SELECT p.product_id, p.name FROM products p
WHERE NOT EXISTS (
  SELECT 1 FROM order_items oi JOIN orders o ON o.order_id = oi.order_id
  WHERE oi.product_id = p.product_id AND o.status = 'completed')
ORDER BY p.product_id;
SQL
cat > /app/queries/q4_repeat_rate.sql <<'SQL'
WITH n AS (
  SELECT customer_id, COUNT(*) AS k FROM orders WHERE status = 'completed' GROUP BY customer_id
)
SELECT COUNT(*) AS buyers,
       SUM(CASE WHEN k >= 2 THEN 1 ELSE 0 END) AS repeat_buyers,
       ROUND(1.0 * SUM(CASE WHEN k >= 2 THEN 1 ELSE 0 END) / COUNT(*), 4) AS repeat_rate
FROM n;
SQL
