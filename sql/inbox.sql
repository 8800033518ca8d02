-- The inbox's SQL side: inbox_write, inbox_subscribe, parking.  (The
-- consumer and handler workers are tested end to end in
-- test/e2e/test_inbox.py.)
CREATE EXTENSION outbox;

-- inbox_write: true for a new event, false for a redelivery.
SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000001', 'payments',
                          '{"amount": 10}', '{"event_type": "PaymentCaptured"}') AS new;
SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000001', 'payments',
                          '{"amount": 10}') AS again;
SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000002', 'payments', '[1]', NULL) AS null_headers;
SELECT event_id, topic, payload, headers, processed, attempts FROM outbox.inbox_message ORDER BY seq;
SELECT inbox_pending, inbox_parked FROM outbox.stats;

-- Bad input: clear errors, nothing stored.
SELECT outbox.inbox_write(NULL, 'payments', '{}');
SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000009', NULL, '{}');
SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000009', 'payments', NULL);
SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000009', 'bad topic', '{}');
SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000009', 'payments', '{}', '[]');
SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000009', 'payments', '{}', '{"a": 1}');
SELECT outbox.inbox_write('not-a-uuid', 'payments', '{}');
SELECT count(*) AS stored FROM outbox.inbox_message;

-- inbox_subscribe: a handler takes (outbox.inbox_message) and returns void.
CREATE TABLE inbox_payments (event_id uuid PRIMARY KEY, amount numeric);
CREATE FUNCTION handle_payment(msg outbox.inbox_message) RETURNS void LANGUAGE sql AS $$
    INSERT INTO inbox_payments VALUES (msg.event_id, (msg.payload->>'amount')::numeric);
$$;
CREATE FUNCTION wrong_args(msg text) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION wrong_result(msg outbox.inbox_message) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;
SELECT outbox.inbox_subscribe('payments', 'handle_payment(outbox.inbox_message)');
SELECT topic, handler, owner = current_user::regrole AS owned_by_subscriber
  FROM outbox.inbox_subscription;
SELECT outbox.inbox_subscribe('payments', 'handle_payment(outbox.inbox_message)');  -- again: replaces
SELECT count(*) FROM outbox.inbox_subscription;
SELECT outbox.inbox_subscribe(NULL, 'handle_payment(outbox.inbox_message)');
SELECT outbox.inbox_subscribe('payments', NULL);
SELECT outbox.inbox_subscribe('pay ments', 'handle_payment(outbox.inbox_message)');
SELECT outbox.inbox_subscribe('payments', 'wrong_args(text)');
SELECT outbox.inbox_subscribe('payments', 'wrong_result(outbox.inbox_message)');
SELECT outbox.inbox_subscribe('payments', 'no_such_function(outbox.inbox_message)');
SELECT outbox.inbox_unsubscribe('payments') AS removed, outbox.inbox_unsubscribe('payments') AS again;

-- Parked inbox messages: the view, and inbox_retry.
UPDATE outbox.inbox_message SET parked_at = now(), attempts = 10, last_error = 'handler failed'
 WHERE event_id = '00000000-0000-7000-8000-000000000002';
SELECT event_id, topic, attempts, last_error FROM outbox.inbox_parked;
SELECT inbox_pending, inbox_parked FROM outbox.stats;
SELECT outbox.inbox_retry('00000000-0000-7000-8000-000000000002') AS put_back,
       outbox.inbox_retry('00000000-0000-7000-8000-000000000002') AS again;
SELECT attempts, parked_at IS NULL AS pending FROM outbox.inbox_message
 WHERE event_id = '00000000-0000-7000-8000-000000000002';
SELECT outbox.inbox_retry(NULL);
SELECT outbox.inbox_retry('00000000-0000-7000-8000-00000000ffff');

-- Privileges: a service consuming in its own code gets EXECUTE on
-- inbox_write and nothing else.
CREATE ROLE regress_outbox_consumer_svc;
SET ROLE regress_outbox_consumer_svc;
SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000003', 'payments', '{}');
RESET ROLE;
GRANT USAGE ON SCHEMA outbox TO regress_outbox_consumer_svc;
GRANT EXECUTE ON FUNCTION outbox.inbox_write(uuid, text, jsonb, jsonb) TO regress_outbox_consumer_svc;
SET ROLE regress_outbox_consumer_svc;
SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000003', 'payments', '{}') AS new;
SELECT count(*) FROM outbox.inbox_message;
SELECT outbox.inbox_subscribe('payments', 'handle_payment(outbox.inbox_message)');
RESET ROLE;
DROP OWNED BY regress_outbox_consumer_svc;
DROP ROLE regress_outbox_consumer_svc;

DROP FUNCTION handle_payment(outbox.inbox_message), wrong_args(text),
              wrong_result(outbox.inbox_message);
DROP TABLE inbox_payments;
DROP EXTENSION outbox;
