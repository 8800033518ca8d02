-- Parked messages: the view, outbox.retry() and outbox.retry_parked().
-- (The relay parks a message after outbox.max_attempts refusals by Kafka;
-- test/e2e/test_faults.py shows that end to end.  Here rows are parked by
-- hand to test the SQL side.)
CREATE EXTENSION outbox;

SELECT outbox.write('order.events', 'k1', '{"n": 1}') AS m1 \gset
SELECT outbox.write('order.events', 'k1', '{"n": 2}') AS m2 \gset
SELECT outbox.write('audit.events', 'k2', '{"n": 3}') AS m3 \gset
SELECT outbox.write('audit.events', 'k3', '{"n": 4}') AS m4 \gset

UPDATE outbox.outbox_message
   SET parked_at = now(), attempts = 10,
       last_error = 'Broker: Message size too large (MSG_SIZE_TOO_LARGE)'
 WHERE message_id IN (:'m1', :'m3', :'m4');
UPDATE outbox.outbox_message SET published_at = now() WHERE message_id = :'m2';

-- The view lists parked, unpublished messages with their error.
SELECT key, topic, attempts, last_error, payload_bytes, parked_at IS NOT NULL AS parked
  FROM outbox.parked_messages ORDER BY id;

-- retry: back in line with attempts reset; true once, then false.
SELECT outbox.retry(:'m1') AS put_back;
SELECT outbox.retry(:'m1') AS again;
SELECT key, attempts, parked_at IS NULL AS pending, last_error IS NOT NULL AS error_kept
  FROM outbox.outbox_message WHERE message_id = :'m1';
-- A published message is not parked: nothing to do.
SELECT outbox.retry(:'m2') AS published;

-- Bad input: clear errors.
SELECT outbox.retry(NULL);
SELECT outbox.retry('00000000-0000-7000-8000-000000000000');
SELECT outbox.retry('not-a-uuid');

-- retry_parked: by topic, then everything left.
SELECT outbox.retry_parked('no.such.topic') AS none;
SELECT outbox.retry_parked('audit.events') AS audit;
SELECT count(*) AS still_parked FROM outbox.parked_messages;
UPDATE outbox.outbox_message SET parked_at = now() WHERE message_id = :'m4';
SELECT outbox.retry_parked() AS all_topics;
SELECT count(*) AS still_parked FROM outbox.parked_messages;

-- None of it is for PUBLIC.
CREATE ROLE regress_outbox_someone;
SET ROLE regress_outbox_someone;
SELECT outbox.retry('00000000-0000-7000-8000-000000000001');
RESET ROLE;
GRANT USAGE ON SCHEMA outbox TO regress_outbox_someone;
SET ROLE regress_outbox_someone;
SELECT outbox.retry('00000000-0000-7000-8000-000000000001');
SELECT outbox.retry_parked();
SELECT * FROM outbox.parked_messages;
SELECT outbox._wake_relay_at_commit();
RESET ROLE;
DROP OWNED BY regress_outbox_someone;
DROP ROLE regress_outbox_someone;

DROP EXTENSION outbox;
