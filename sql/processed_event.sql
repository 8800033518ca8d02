-- outbox.mark_processed / outbox.is_processed: the idempotent consumer.
CREATE EXTENSION outbox;

-- First sight: true; every redelivery: false.
SELECT outbox.mark_processed('evt-1', 'payments') AS first;
SELECT outbox.mark_processed('evt-1', 'payments') AS redelivery;
SELECT outbox.mark_processed('evt-1') AS redelivery_without_topic;
SELECT outbox.is_processed('evt-1') AS seen, outbox.is_processed('evt-2') AS unseen;

-- The row: topic kept, remembered for the default 72 hours.
SELECT event_id, topic, expires_at - processed_at AS ttl FROM outbox.processed_event;

-- The consumer's transaction decides: a rolled-back mark is forgotten,
-- so the redelivered message is processed again.
BEGIN;
SELECT outbox.mark_processed('evt-2', 'payments') AS first;
ROLLBACK;
SELECT outbox.is_processed('evt-2') AS seen_after_rollback;
SELECT outbox.mark_processed('evt-2', 'payments') AS first_again;

-- Twice in one transaction: the second is a duplicate.
BEGIN;
SELECT outbox.mark_processed('evt-3') AS first, outbox.mark_processed('evt-3') AS second;
COMMIT;

-- A custom ttl.
SELECT outbox.mark_processed('evt-4', 'payments', '10 minutes') AS first;
SELECT expires_at - processed_at AS ttl FROM outbox.processed_event WHERE event_id = 'evt-4';

-- Once its ttl has passed, an entry is forgotten (whether or not retention
-- deleted it yet): the event counts as new, with a fresh expiry.
UPDATE outbox.processed_event SET expires_at = now() - interval '1 second'
 WHERE event_id = 'evt-1';
SELECT outbox.is_processed('evt-1') AS seen_after_expiry;
SELECT outbox.mark_processed('evt-1', 'refunds', '1 hour') AS first_after_expiry;
SELECT outbox.mark_processed('evt-1') AS redelivery;
SELECT topic, expires_at - processed_at AS ttl, expires_at > now() AS live
  FROM outbox.processed_event WHERE event_id = 'evt-1';

-- The typical consumer: process only what is new, in the same transaction.
CREATE TABLE payments (event_id text PRIMARY KEY, amount numeric);
CREATE FUNCTION handle_payment(evt text, amount numeric) RETURNS void LANGUAGE sql AS $$
    INSERT INTO payments SELECT evt, amount WHERE outbox.mark_processed(evt, 'payments');
$$;
SELECT handle_payment('pay-1', 10), handle_payment('pay-2', 20), handle_payment('pay-1', 10);
SELECT * FROM payments ORDER BY event_id;

-- Bad input: clear errors.
SELECT outbox.mark_processed(NULL);
SELECT outbox.mark_processed('');
SELECT outbox.mark_processed('evt-x', 'payments', '0 seconds');
SELECT outbox.mark_processed('evt-x', 'payments', '-1 hour');
SELECT outbox.mark_processed('evt-x', 'payments', NULL);
SELECT outbox.is_processed(NULL) AS null_is_unknown;
SELECT outbox.is_processed('evt-x') AS nothing_marked_by_errors;

DROP EXTENSION outbox;
