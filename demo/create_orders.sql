-- An order service's CreateOrder, in SQL: the order row and its OrderCreated event
-- commit together or not at all.  No Kafka call here: the
-- relay worker inside Postgres publishes what commits.
CREATE EXTENSION IF NOT EXISTS outbox;
CREATE TABLE IF NOT EXISTS orders (
    order_id    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    customer_id uuid NOT NULL,
    amount      numeric(12, 2) NOT NULL,
    status      text NOT NULL DEFAULT 'pending'
);

-- One CreateOrder transaction: insert the order, write its event.
CREATE OR REPLACE FUNCTION create_order(customer uuid, amount numeric) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    id uuid;
BEGIN
    INSERT INTO orders (customer_id, amount) VALUES (customer, amount) RETURNING order_id INTO id;
    PERFORM outbox.write(
        'order.events',
        id::text,                                   -- key: all events of an order, in order
        jsonb_build_object('order_id', id, 'customer_id', customer, 'amount', amount),
        jsonb_build_object('event_type', 'OrderCreated'));
    RETURN id;
END $$;

\echo 'committing 5 orders, rolling back 2 (their events must never reach Kafka)'
BEGIN; SELECT create_order(gen_random_uuid(), 42.50) AS committed_order; COMMIT;
BEGIN; SELECT create_order(gen_random_uuid(), 19.99) AS committed_order; COMMIT;
BEGIN; SELECT create_order(gen_random_uuid(), 99.00) AS rolled_back_order; ROLLBACK;
BEGIN; SELECT create_order(gen_random_uuid(), 7.25) AS committed_order; COMMIT;
BEGIN; SELECT create_order(gen_random_uuid(), 1000.00) AS rolled_back_order; ROLLBACK;
BEGIN; SELECT create_order(gen_random_uuid(), 12.00) AS committed_order; COMMIT;
BEGIN; SELECT create_order(gen_random_uuid(), 3.10) AS committed_order; COMMIT;

-- A deleted order: its key gets a tombstone (a null value), the way a
-- compacted topic forgets a key.  It lands on the key's partition, after
-- the order's OrderCreated.
\echo 'deleting the largest order: a tombstone for its key'
BEGIN;
WITH gone AS (DELETE FROM orders WHERE order_id = (SELECT order_id FROM orders ORDER BY amount DESC LIMIT 1)
              RETURNING order_id)
SELECT outbox.write_bytes('order.events', convert_to(order_id::text, 'UTF8'), NULL,
                          '{"event_type": "OrderDeleted"}') IS NOT NULL AS tombstone_written
  FROM gone;
COMMIT;
