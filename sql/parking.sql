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

-- Where is my message?  outbox.message_status() names its state and, once
-- published, the partition and offset of its record (schema 1.6).  It runs
-- with the caller's rights: a role that may not read the table learns nothing.
TRUNCATE outbox.outbox_message;
SELECT outbox.write('status.t', 'k', '{}') AS pending_id \gset
SELECT outbox.write('status.t', 'k', '{}') AS published_id \gset
SELECT outbox.write('status.t', 'k', '{}') AS parked_id \gset
UPDATE outbox.outbox_message SET published_at = now(), published_partition = 3, published_offset = 41
 WHERE message_id = :'published_id';
UPDATE outbox.outbox_message SET parked_at = now(), attempts = 3, last_error = 'Broker: Message size too large'
 WHERE message_id = :'parked_id';
SELECT state, attempts, last_error, kafka_partition, kafka_offset, published_at IS NOT NULL AS published
  FROM outbox.message_status(:'pending_id');
SELECT state, kafka_partition, kafka_offset, published_at IS NOT NULL AS published
  FROM outbox.message_status(:'published_id');
SELECT state, attempts, last_error FROM outbox.message_status(:'parked_id');
SELECT count(*) FROM outbox.message_status('00000000-0000-7000-8000-000000000009');
SELECT count(*) FROM outbox.message_status(NULL);
-- A replay forgets the place with published_at.
SELECT outbox.replay(now() - interval '1 hour');
SELECT state, kafka_partition, kafka_offset FROM outbox.message_status(:'published_id');
CREATE ROLE regress_outbox_writer_only;
GRANT USAGE ON SCHEMA outbox TO regress_outbox_writer_only;
GRANT EXECUTE ON FUNCTION outbox.write(text, text, jsonb, jsonb, integer) TO regress_outbox_writer_only;
SET ROLE regress_outbox_writer_only;
SELECT * FROM outbox.message_status(:'published_id');
RESET ROLE;
DROP OWNED BY regress_outbox_writer_only;
DROP ROLE regress_outbox_writer_only;

DROP EXTENSION outbox;
