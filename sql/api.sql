-- outbox.write(): what it stores, what it returns, what it refuses.
CREATE EXTENSION outbox;

-- Report an error as SQLSTATE and message, so that the tests show both.
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    DECLARE detail text;
    BEGIN
        GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
        RETURN SQLSTATE || ': ' || SQLERRM || coalesce(' (' || nullif(detail, '') || ')', '');
    END;
END $$;

-- A message is a row: topic, key, payload and headers as given, pending.
SELECT outbox.write('order.events', 'order-1', '{"order_id": 1, "amount": 10.5}',
                    '{"event_type": "OrderCreated"}') IS NOT NULL AS wrote;
SELECT id, topic, key, payload, headers, published_at IS NULL AS pending, attempts, last_error
  FROM outbox.outbox_message ORDER BY id;

-- The returned id is the row's message_id: a version 7 (time-ordered) UUID.
CREATE TEMP TABLE written AS
    SELECT outbox.write('order.events', 'order-2', '[1, 2, 3]') AS message_id;
SELECT m.key, m.payload, m.headers, substr(w.message_id::text, 15, 1) AS uuid_version
  FROM written w JOIN outbox.outbox_message m USING (message_id);

-- Any JSON value is a payload; NULL headers mean no headers.
SELECT outbox.write('t', 'k', '"a string"') IS NOT NULL AS scalar_payload,
       outbox.write('t', 'k', 'null') IS NOT NULL AS json_null_payload,
       outbox.write('t', 'k', '{}', NULL) IS NOT NULL AS null_headers;
SELECT payload, headers FROM outbox.outbox_message WHERE topic = 't' ORDER BY id;

-- Ids follow write order; message ids are distinct.
SELECT count(*) AS messages, count(DISTINCT message_id) AS distinct_ids,
       bool_and(created_at <= now()) AS created_in_the_past
  FROM outbox.outbox_message;

-- Rollback discards the message; so does a rolled-back savepoint.
BEGIN;
SELECT outbox.write('order.events', 'rolled-back', '{}') IS NOT NULL AS wrote;
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT outbox.write('order.events', 'rolled-back', '{}') IS NOT NULL AS wrote;
ROLLBACK TO SAVEPOINT s;
SELECT outbox.write('order.events', 'kept', '{}') IS NOT NULL AS wrote;
COMMIT;
SELECT key, count(*) FROM outbox.outbox_message
 WHERE key IN ('rolled-back', 'kept') GROUP BY key ORDER BY key;

-- NULL arguments: 22004, naming the argument.
SELECT pg_temp.try($$SELECT outbox.write(NULL, 'k', '{}')$$);
SELECT pg_temp.try($$SELECT outbox.write('t', NULL, '{}')$$);
SELECT pg_temp.try($$SELECT outbox.write('t', 'k', NULL)$$);

-- Topics Kafka would refuse: 22023, naming the topic and the rule.
SELECT pg_temp.try($$SELECT outbox.write('', 'k', '{}')$$);
SELECT pg_temp.try($$SELECT outbox.write('.', 'k', '{}')$$);
SELECT pg_temp.try($$SELECT outbox.write('..', 'k', '{}')$$);
SELECT pg_temp.try($$SELECT outbox.write('order events', 'k', '{}')$$);
SELECT pg_temp.try($$SELECT outbox.write('orders/eu', 'k', '{}')$$);
SELECT pg_temp.try($$SELECT outbox.write('ordér', 'k', '{}')$$);
SELECT pg_temp.try(format('SELECT outbox.write(%L, %L, %L)', repeat('x', 250), 'k', '{}'))
       LIKE '22023: outbox.write: invalid topic "xxx%(A topic name must be at most 249 characters long.)'
       AS too_long_refused;
SELECT pg_temp.try(format('SELECT outbox.write(%L, %L, %L)', repeat('x', 249), 'k', '{}'))
       AS longest_topic;
SELECT pg_temp.try($$SELECT outbox.write('a-Z_0.9', 'k', '{}')$$) AS all_allowed_characters;

-- Headers must be a JSON object of strings: 22023, naming the header.
SELECT pg_temp.try($$SELECT outbox.write('t', 'k', '{}', '[]')$$);
SELECT pg_temp.try($$SELECT outbox.write('t', 'k', '{}', '"x"')$$);
SELECT pg_temp.try($$SELECT outbox.write('t', 'k', '{}', 'null')$$);
SELECT pg_temp.try($$SELECT outbox.write('t', 'k', '{}', '{"event_type": "A", "retries": 3}')$$);
SELECT pg_temp.try($$SELECT outbox.write('t', 'k', '{}', '{"a": null}')$$);
SELECT pg_temp.try($$SELECT outbox.write('t', 'k', '{}', '{"a": {"b": "c"}}')$$);
SELECT pg_temp.try($$SELECT outbox.write('t', 'k', '{}', '{"a": true}')$$);
-- Wrong types are refused by Postgres before the function runs.
SELECT pg_temp.try($$SELECT outbox.write('t', 'k', 'not json')$$);
SELECT pg_temp.try($$SELECT outbox.write('t', 'k', '{}', '{"a": "b"')$$);

-- A refused write aborts only its own transaction; committed messages stay.
SELECT count(*) AS before FROM outbox.outbox_message \gset
BEGIN;
SELECT outbox.write('t', 'k', '{}') IS NOT NULL AS wrote;
SELECT outbox.write('bad topic', 'k', '{}');
COMMIT;
SELECT count(*) - :before AS added FROM outbox.outbox_message;

-- A caller-chosen event_id header is kept as given (the relay adds
-- event_id = message_id only when it is missing).
SELECT outbox.write('t', 'k-evt', '{}', '{"event_id": "my-own-id"}') IS NOT NULL AS wrote;
SELECT headers FROM outbox.outbox_message WHERE key = 'k-evt';

-- The relay reads pending rows through the partial index of pending rows, in id order.
SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_outbox_message_unpublished';
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF)
SELECT id FROM outbox.outbox_message WHERE published_at IS NULL ORDER BY id LIMIT 10
   FOR UPDATE SKIP LOCKED;
RESET enable_seqscan;
RESET enable_bitmapscan;

DROP EXTENSION outbox;
