-- The guarded statements of agentruns.transitions on PostgreSQL (docs/design.md §2); sqlite.sql
-- holds the same names for SQLite. Read once by agentruns.transitions._statements.
--
-- Format: each statement starts with a line "-- name --", then comment lines saying what it
-- writes and its guard, then the SQL. Parameters are bound by name: %(name)s.
--
-- Conventions:
-- * The clock is the database's: STATEMENT_TIMESTAMP(), what Django compiles Now() to; a
--   deadline is that clock plus a number of seconds.
-- * A parameter named after a column of the run holds that column's value, adapted by its model
--   field (JSON and decimals as Django writes them). %(owner)s and %(epoch)s are a lease's
--   claimed_by and lease_epoch.
-- * COALESCE(%(column)s, column): the value when one is given, else the column kept.
-- * A segment's or a decision's events are numbered and chained before the statement runs
--   (agentruns.ledger): %(events)s is a JSON array with one element per event (JSON columns as
--   JSON text inside it), %(head)s and %(next_sequence)s the run's ledger tail after them
--   (NULL: no events, the tail kept), %(first_sequence)s the sequence the first takes. The
--   UPDATE and the INSERT are one statement: a guard that matches nothing inserts nothing.
-- * No row returned: the guard matched nothing, and nothing was written.


-- heartbeat --
-- A segment's step boundary: renew the lease; save the loop state and the run's cost so far
-- when given; append the events.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
WITH run AS (
    UPDATE agentruns_agentrun
       SET lease_expires = STATEMENT_TIMESTAMP() + %(lease_seconds)s * INTERVAL '1 second',
           loop_state = COALESCE(%(loop_state)s::jsonb, loop_state),
           cost = COALESCE(%(cost)s::numeric, cost),
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s
       AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
       AND (%(first_sequence)s::integer IS NULL OR next_sequence = %(first_sequence)s::integer)
    RETURNING id
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT id FROM run;


-- stamp_fence --
-- Before a write runs: stamp its effect and call on the run (the fence); renew the lease; save
-- the loop state when given.
-- Guard: the owner (running, claimed_by, lease_epoch).
UPDATE agentruns_agentrun
   SET pending_effect = %(pending_effect)s,
       pending_call = %(pending_call)s::jsonb,
       lease_expires = STATEMENT_TIMESTAMP() + %(lease_seconds)s * INTERVAL '1 second',
       loop_state = COALESCE(%(loop_state)s::jsonb, loop_state),
       updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
RETURNING id;


-- clear_fence --
-- After a write ran: clear the fence; renew the lease; save the loop state and the cost when
-- given; append the events (the write's own among them).
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
WITH run AS (
    UPDATE agentruns_agentrun
       SET pending_effect = '',
           pending_call = NULL,
           lease_expires = STATEMENT_TIMESTAMP() + %(lease_seconds)s * INTERVAL '1 second',
           loop_state = COALESCE(%(loop_state)s::jsonb, loop_state),
           cost = COALESCE(%(cost)s::numeric, cost),
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s
       AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
       AND (%(first_sequence)s::integer IS NULL OR next_sequence = %(first_sequence)s::integer)
    RETURNING id
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT id FROM run;


-- suspend --
-- Park a running run in %(status)s (waiting_for_approval or waiting_for_input) with its pending
-- turn, the claim and lease released; its approval deadline the clock plus %(wait_seconds)s
-- (NULL: none) with its action, an earlier wait's escalation cleared; the loop state saved, the
-- cost when given; the events appended. Returns the parked row.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = %(status)s,
           pending_turn = %(pending_turn)s::jsonb,
           claimed_by = '',
           lease_expires = NULL,
           approval_deadline = CASE WHEN %(wait_seconds)s::float8 IS NULL THEN NULL
               ELSE STATEMENT_TIMESTAMP() + %(wait_seconds)s::float8 * INTERVAL '1 second' END,
           approval_timeout_action = %(approval_timeout_action)s,
           escalated_at = NULL,
           escalated_to_id = NULL,
           loop_state = %(loop_state)s::jsonb,
           cost = COALESCE(%(cost)s::numeric, cost),
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s
       AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
       AND (%(first_sequence)s::integer IS NULL OR next_sequence = %(first_sequence)s::integer)
    RETURNING *
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT * FROM run;


-- park_in_doubt --
-- Park a running run whose non-idempotent write has an unknown outcome in
-- waiting_for_reconciliation with its reconciliation turn; the claim and lease released, the
-- fence kept (it names the call); the loop state saved; the events appended.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = 'waiting_for_reconciliation',
           pending_turn = %(pending_turn)s::jsonb,
           claimed_by = '',
           lease_expires = NULL,
           loop_state = %(loop_state)s::jsonb,
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s
       AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
       AND (%(first_sequence)s::integer IS NULL OR next_sequence = %(first_sequence)s::integer)
    RETURNING id
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT id FROM run;


-- requeue --
-- Hand a failed running run back to the queue for a retry: queued, the retry budget spent by
-- one, claim, lease and fence cleared, the error kept; the events appended.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = 'queued',
           requeue_count = requeue_count + 1,
           claimed_by = '',
           lease_expires = NULL,
           pending_effect = '',
           pending_call = NULL,
           error = %(error)s::jsonb,
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s
       AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
       AND (%(first_sequence)s::integer IS NULL OR next_sequence = %(first_sequence)s::integer)
    RETURNING id
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT id FROM run;


-- hand_back --
-- Hand a running run back to the queue because its worker is stopping: queued, claim, lease
-- and fence cleared, the retry budget untouched; the loop state saved, the cost when given; the
-- events appended.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = 'queued',
           claimed_by = '',
           lease_expires = NULL,
           pending_effect = '',
           pending_call = NULL,
           loop_state = %(loop_state)s::jsonb,
           cost = COALESCE(%(cost)s::numeric, cost),
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s
       AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
       AND (%(first_sequence)s::integer IS NULL OR next_sequence = %(first_sequence)s::integer)
    RETURNING id
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT id FROM run;


-- settle_own --
-- A segment ends its run: %(status)s (terminal) with its reason, output and error; claim,
-- lease, fence and pending turn cleared; finished now; the totals (tokens, cost, rounds, the
-- loop state, a structured answer) when given; the events appended.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = %(status)s,
           termination_reason = %(termination_reason)s,
           output = %(output)s,
           error = %(error)s::jsonb,
           claimed_by = '',
           lease_expires = NULL,
           pending_effect = '',
           pending_call = NULL,
           pending_turn = NULL,
           finished_at = STATEMENT_TIMESTAMP(),
           prompt_tokens = COALESCE(%(prompt_tokens)s::integer, prompt_tokens),
           completion_tokens = COALESCE(%(completion_tokens)s::integer, completion_tokens),
           total_tokens = COALESCE(%(total_tokens)s::integer, total_tokens),
           cost = COALESCE(%(cost)s::numeric, cost),
           iterations = COALESCE(%(iterations)s::integer, iterations),
           truncated = COALESCE(%(truncated)s::boolean, truncated),
           loop_state = COALESCE(%(loop_state)s::jsonb, loop_state),
           output_object = COALESCE(%(output_object)s::jsonb, output_object),
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s
       AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
       AND (%(first_sequence)s::integer IS NULL OR next_sequence = %(first_sequence)s::integer)
    RETURNING id
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT id FROM run;


-- claim --
-- A worker claims the queued run named by %(uuid)s: running, claimed by %(owner)s until the
-- clock plus the lease, epoch %(epoch)s, started now unless it started before; its lease event
-- appended. Returns the row as claimed, then its configuration's columns.
-- Guard: queued, driven by %(external_framework)s ('' for Leasehold's own loop: a worker
-- never claims a run an external agent loop drives, nor that loop a native run), and the tail
-- its event is chained from, as the claim expects it: lease_epoch, next_sequence, ledger_head.
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = 'running',
           claimed_by = %(owner)s,
           lease_expires = STATEMENT_TIMESTAMP() + %(lease_seconds)s * INTERVAL '1 second',
           lease_epoch = %(epoch)s,
           started_at = COALESCE(started_at, STATEMENT_TIMESTAMP()),
           ledger_head = %(head)s,
           next_sequence = %(next_sequence)s,
           updated_at = STATEMENT_TIMESTAMP()
     WHERE uuid = %(uuid)s
       AND status = 'queued'
       AND external_framework = %(external_framework)s
       AND lease_epoch = %(expected_epoch)s
       AND next_sequence = %(first_sequence)s
       AND ledger_head = %(expected_head)s
    RETURNING *
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT run.*, configuration.*
  FROM run
  LEFT JOIN agentruns_agentconfiguration AS configuration
         ON configuration.id = run.configuration_id;


-- lock_waiting_run --
-- A decision's read (it writes nothing): the run %(uuid)s, locked (FOR UPDATE OF the run
-- only), with its configuration and that configuration's approver group (id, name) in the same
-- statement, for the decision to check and record under the lock (transitions.deciding).
-- No row: no such run.
SELECT run.*, configuration.*,
       approver_group.id AS approver_group_id, approver_group.name AS approver_group_name
  FROM agentruns_agentrun AS run
  JOIN agentruns_agentconfiguration AS configuration
    ON configuration.id = run.configuration_id
  LEFT JOIN auth_group AS approver_group
    ON approver_group.id = configuration.approver_group_id
 WHERE run.uuid = %(uuid)s
   FOR UPDATE OF run;


-- decide_queue --
-- A decision on a waiting run (read and checked under its row lock), handed to a worker:
-- queued with the decision in its loop state; pending turn, fence and approval deadline
-- cleared; the decision's event appended. Returns the row as decided.
-- Guard: status %(status)s (the status the decision was made on).
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = 'queued',
           loop_state = %(loop_state)s::jsonb,
           pending_turn = NULL,
           pending_effect = '',
           pending_call = NULL,
           approval_deadline = NULL,
           approval_timeout_action = '',
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s AND status = %(status)s
    RETURNING *
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT * FROM run;


-- decide_resume --
-- A decision on a waiting run (read and checked under its row lock), continued inline:
-- running, claimed by %(owner)s until the clock plus the lease, epoch %(epoch)s, the decision
-- in its loop state; pending turn, fence and approval deadline cleared; the decision's event
-- appended. Returns the row as decided and, as known_events, the run's events before the
-- decision ([sequence, kind, payload] in sequence order, one JSON array: the statement's snapshot
-- does not see its own insert), read under the row lock: the continuation rebuilds its dialogue
-- from them without reading them again.
-- Guard: status %(status)s (the status the decision was made on).
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = 'running',
           claimed_by = %(owner)s,
           lease_expires = STATEMENT_TIMESTAMP() + %(lease_seconds)s * INTERVAL '1 second',
           lease_epoch = %(epoch)s,
           loop_state = %(loop_state)s::jsonb,
           pending_turn = NULL,
           pending_effect = '',
           pending_call = NULL,
           approval_deadline = NULL,
           approval_timeout_action = '',
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s AND status = %(status)s
    RETURNING *
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT run.*,
       (SELECT COALESCE(json_agg(json_build_array(e.sequence, e.kind, e.payload)
                                 ORDER BY e.sequence), '[]')::text
          FROM agentruns_agentrunevent e
         WHERE e.run_id = run.id) AS known_events
  FROM run;


-- reconcile_abandon --
-- An operator gives up on an in-doubt run (read and checked under its row lock): failed /
-- reconciled_abandoned, the verdict in its loop state; pending turn, claim, lease and fence
-- cleared; finished now; the event appended. Returns the row as settled.
-- Guard: waiting_for_reconciliation.
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = 'failed',
           termination_reason = 'reconciled_abandoned',
           loop_state = %(loop_state)s::jsonb,
           pending_turn = NULL,
           claimed_by = '',
           lease_expires = NULL,
           pending_effect = '',
           pending_call = NULL,
           finished_at = STATEMENT_TIMESTAMP(),
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s AND status = 'waiting_for_reconciliation'
    RETURNING *
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT * FROM run;


-- note_check --
-- A tool's automatic check records where it stands on an in-doubt run (read under its row
-- lock): the pending turn rewritten with the check's status; the events appended.
-- Guard: waiting_for_reconciliation.
WITH run AS (
    UPDATE agentruns_agentrun
       SET pending_turn = %(pending_turn)s::jsonb,
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s AND status = 'waiting_for_reconciliation'
    RETURNING id
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT id FROM run;


-- expire_deny --
-- The approval deadline of a waiting run passed (read under its row lock): the turn denied on
-- the deadline's behalf (the denial in the loop state), queued for a worker; pending turn,
-- claim, lease and the deadline with its action cleared; the decision's event appended.
-- Guard: status %(status)s, one that has a deadline, and the deadline before the clock.
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = 'queued',
           loop_state = %(loop_state)s::jsonb,
           pending_turn = NULL,
           claimed_by = '',
           lease_expires = NULL,
           approval_deadline = NULL,
           approval_timeout_action = '',
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s AND status = %(status)s
       AND status IN ('waiting_for_approval', 'waiting_for_input')
       AND approval_deadline < STATEMENT_TIMESTAMP()
    RETURNING id
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT id FROM run;


-- expire_fail --
-- The approval deadline of a waiting run passed (read under its row lock) and it fails:
-- failed / approval_expired with the error; pending turn, claim, lease, fence and the deadline
-- with its action cleared; finished now; the decision's event appended.
-- Guard: status %(status)s, one that has a deadline, and the deadline before the clock.
WITH run AS (
    UPDATE agentruns_agentrun
       SET status = 'failed',
           termination_reason = 'approval_expired',
           error = %(error)s::jsonb,
           loop_state = %(loop_state)s::jsonb,
           pending_turn = NULL,
           claimed_by = '',
           lease_expires = NULL,
           pending_effect = '',
           pending_call = NULL,
           approval_deadline = NULL,
           approval_timeout_action = '',
           finished_at = STATEMENT_TIMESTAMP(),
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s AND status = %(status)s
       AND status IN ('waiting_for_approval', 'waiting_for_input')
       AND approval_deadline < STATEMENT_TIMESTAMP()
    RETURNING id
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT id FROM run;


-- escalate --
-- The approval deadline of a waiting run whose action is escalate passed (read under its row
-- lock): handed to the escalation group %(escalated_to_id)s now, a second deadline the clock
-- plus %(wait_seconds)s with the final action; it keeps waiting; the escalation event appended.
-- Guard: status %(status)s, one that has a deadline, the deadline before the clock, and the
-- action escalate.
WITH run AS (
    UPDATE agentruns_agentrun
       SET approval_deadline = STATEMENT_TIMESTAMP() + %(wait_seconds)s * INTERVAL '1 second',
           approval_timeout_action = %(approval_timeout_action)s,
           escalated_at = STATEMENT_TIMESTAMP(),
           escalated_to_id = %(escalated_to_id)s,
           ledger_head = COALESCE(%(head)s, ledger_head),
           next_sequence = COALESCE(%(next_sequence)s::integer, next_sequence),
           updated_at = STATEMENT_TIMESTAMP()
     WHERE id = %(run_id)s AND status = %(status)s
       AND status IN ('waiting_for_approval', 'waiting_for_input')
       AND approval_deadline < STATEMENT_TIMESTAMP()
       AND approval_timeout_action = 'escalate'
    RETURNING id
), appended AS (
    INSERT INTO agentruns_agentrunevent
           (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
            created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
    SELECT run.id, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
           e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
           e.ledger_version, e.ledger_key
      FROM run, jsonb_to_recordset(%(events)s::jsonb) AS e(
               sequence integer, kind text, segment text, lease_epoch integer,
               duration_ms integer, payload text, actor integer, created_at timestamptz,
               prev_hash text, hash text, ledger_version smallint, ledger_key text)
)
SELECT id FROM run;


-- The guarded writes below take the row without a lock or a lease beforehand: each returns
-- the run's ledger tail (uuid, ledger_head, next_sequence) under the row it now holds, its
-- events are chained from it and appended (append_events) and the new tail written
-- (write_tail), in the same transaction.


-- settle_unfinished --
-- End a run that has not ended: %(status)s (terminal) with its reason, output and error;
-- claim, lease, fence and pending turn cleared; finished now; the totals when given.
-- Guard: not terminal (queued, running or waiting).
UPDATE agentruns_agentrun
   SET status = %(status)s,
       termination_reason = %(termination_reason)s,
       output = %(output)s,
       error = %(error)s::jsonb,
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       pending_turn = NULL,
       finished_at = STATEMENT_TIMESTAMP(),
       prompt_tokens = COALESCE(%(prompt_tokens)s::integer, prompt_tokens),
       completion_tokens = COALESCE(%(completion_tokens)s::integer, completion_tokens),
       total_tokens = COALESCE(%(total_tokens)s::integer, total_tokens),
       cost = COALESCE(%(cost)s::numeric, cost),
       iterations = COALESCE(%(iterations)s::integer, iterations),
       truncated = COALESCE(%(truncated)s::boolean, truncated),
       loop_state = COALESCE(%(loop_state)s::jsonb, loop_state),
       output_object = COALESCE(%(output_object)s::jsonb, output_object),
       updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status IN ('queued', 'running', 'waiting_for_approval', 'waiting_for_input',
                  'waiting_for_reconciliation')
RETURNING id, uuid, ledger_head, next_sequence;


-- settle_stale --
-- The reaper ends a run whose holder stopped renewing its lease: as settle_unfinished.
-- Guard: running and lease_expires before the clock.
UPDATE agentruns_agentrun
   SET status = %(status)s,
       termination_reason = %(termination_reason)s,
       output = %(output)s,
       error = %(error)s::jsonb,
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       pending_turn = NULL,
       finished_at = STATEMENT_TIMESTAMP(),
       prompt_tokens = COALESCE(%(prompt_tokens)s::integer, prompt_tokens),
       completion_tokens = COALESCE(%(completion_tokens)s::integer, completion_tokens),
       total_tokens = COALESCE(%(total_tokens)s::integer, total_tokens),
       cost = COALESCE(%(cost)s::numeric, cost),
       iterations = COALESCE(%(iterations)s::integer, iterations),
       truncated = COALESCE(%(truncated)s::boolean, truncated),
       loop_state = COALESCE(%(loop_state)s::jsonb, loop_state),
       output_object = COALESCE(%(output_object)s::jsonb, output_object),
       updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status = 'running' AND lease_expires < STATEMENT_TIMESTAMP()
RETURNING id, uuid, ledger_head, next_sequence;


-- cancel --
-- Cancel a run that has not ended: cancelled; the lease ends now, and so do the pending turn
-- and a waiting run's approval deadline; finished now. A running holder keeps claimed_by and
-- lease_epoch, to recognise the cancel at its next boundary (notice_cancel).
-- Guard: not terminal (queued, running or waiting).
UPDATE agentruns_agentrun
   SET status = 'cancelled',
       termination_reason = 'cancelled',
       lease_expires = NULL,
       pending_turn = NULL,
       approval_deadline = NULL,
       approval_timeout_action = '',
       finished_at = STATEMENT_TIMESTAMP(),
       updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status IN ('queued', 'running', 'waiting_for_approval', 'waiting_for_input',
                  'waiting_for_reconciliation')
RETURNING id, uuid, ledger_head, next_sequence;


-- cancel_unless_in_doubt --
-- As cancel, for a caller who may not end a run in doubt.
-- Guard: not terminal and not waiting_for_reconciliation.
UPDATE agentruns_agentrun
   SET status = 'cancelled',
       termination_reason = 'cancelled',
       lease_expires = NULL,
       pending_turn = NULL,
       approval_deadline = NULL,
       approval_timeout_action = '',
       finished_at = STATEMENT_TIMESTAMP(),
       updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status IN ('queued', 'running', 'waiting_for_approval', 'waiting_for_input')
RETURNING id, uuid, ledger_head, next_sequence;


-- abandon --
-- The interactive client of a running run went away: failed / abandoned with the error; claim,
-- lease and pending turn cleared; finished now.
-- Guard: the owner (running, claimed_by, lease_epoch) and no fence (no write in flight).
UPDATE agentruns_agentrun
   SET status = 'failed',
       termination_reason = 'abandoned',
       error = %(error)s::jsonb,
       claimed_by = '',
       lease_expires = NULL,
       pending_turn = NULL,
       finished_at = STATEMENT_TIMESTAMP(),
       updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
   AND pending_effect = ''
RETURNING id, uuid, ledger_head, next_sequence;


-- notice_cancel --
-- The segment holding a cancelled run saw the cancel at a boundary: the claim released, the
-- cost so far when given.
-- Guard: cancelled and still naming the owner (claimed_by, lease_epoch).
UPDATE agentruns_agentrun
   SET claimed_by = '',
       cost = COALESCE(%(cost)s::numeric, cost),
       updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status = 'cancelled' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
RETURNING id, uuid, ledger_head, next_sequence;


-- reclaim_stale --
-- The reaper takes a run whose holder stopped renewing its lease back to the queue: queued,
-- the retry budget spent by one, claim, lease and fence cleared.
-- Guard: running and lease_expires before the clock.
UPDATE agentruns_agentrun
   SET status = 'queued',
       requeue_count = requeue_count + 1,
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status = 'running' AND lease_expires < STATEMENT_TIMESTAMP()
RETURNING id, uuid, ledger_head, next_sequence;


-- mark_in_doubt --
-- The reaper parks a run whose holder died mid non-idempotent write in
-- waiting_for_reconciliation with its reconciliation turn; claim and lease cleared, the fence
-- kept for the reconciler.
-- Guard: running, lease_expires before the clock, and the fence non_idempotent_write.
UPDATE agentruns_agentrun
   SET status = 'waiting_for_reconciliation',
       claimed_by = '',
       lease_expires = NULL,
       pending_turn = %(pending_turn)s::jsonb,
       updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status = 'running' AND lease_expires < STATEMENT_TIMESTAMP()
   AND pending_effect = 'non_idempotent_write'
RETURNING id, uuid, ledger_head, next_sequence;


-- settle_undispatched --
-- A run the reaper took back whose wake-up could not be sent: failed / not_retryable with the
-- error, pending turn cleared, finished now.
-- Guard: queued, unclaimed and still at the epoch the reclaim left (%(lease_epoch)s).
UPDATE agentruns_agentrun
   SET status = 'failed',
       termination_reason = 'not_retryable',
       error = %(error)s::jsonb,
       pending_turn = NULL,
       finished_at = STATEMENT_TIMESTAMP(),
       updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status = 'queued' AND claimed_by = '' AND lease_epoch = %(lease_epoch)s
RETURNING id, uuid, ledger_head, next_sequence;


-- mark_redispatched --
-- The reaper is about to send a queued run nobody claimed a fresh wake-up: updated_at bumped
-- (the next redispatch waits a whole period).
-- Guard: queued, unclaimed, and not touched for %(older_than_seconds)s by the clock.
UPDATE agentruns_agentrun
   SET updated_at = STATEMENT_TIMESTAMP()
 WHERE id = %(run_id)s
   AND status = 'queued' AND claimed_by = ''
   AND updated_at < STATEMENT_TIMESTAMP() - %(older_than_seconds)s * INTERVAL '1 second'
RETURNING id, uuid, ledger_head, next_sequence;


-- append_events --
-- Append events (%(events)s, each naming its run) numbered and chained by the caller, in the
-- transaction of the guarded write that holds their runs.
INSERT INTO agentruns_agentrunevent
       (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
        created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
SELECT e.run, e.sequence, e.kind, e.segment, e.lease_epoch, e.duration_ms,
       e.payload::jsonb, e.actor, e.created_at, e.actor, e.prev_hash, e.hash,
       e.ledger_version, e.ledger_key
  FROM jsonb_to_recordset(%(events)s::jsonb) AS e(
           run bigint, sequence integer, kind text, segment text, lease_epoch integer,
           duration_ms integer, payload text, actor integer, created_at timestamptz,
           prev_hash text, hash text, ledger_version smallint, ledger_key text);


-- write_tail --
-- The run's ledger head and next sequence after the events just appended, in the transaction
-- of the guarded write that holds its row.
UPDATE agentruns_agentrun
   SET ledger_head = %(head)s,
       next_sequence = %(next_sequence)s
 WHERE id = %(run_id)s;


-- The reaper's batches: one statement per verdict for many runs it holds (FOR UPDATE), each
-- run's own values in %(runs)s (a JSON array, one element per run, JSON columns as JSON text
-- inside it), the guard checked row by row. Returns the ids of the runs taken; their reaper
-- events are appended after (append_events), chained before (the new tails are in %(runs)s).


-- reap_in_doubt --
-- Park each stale run caught mid non-idempotent write in waiting_for_reconciliation with its
-- reconciliation turn; claim and lease cleared, the fence kept for the reconciler.
-- Guard: running, lease_expires before the clock, and the fence non_idempotent_write.
UPDATE agentruns_agentrun AS run
   SET status = 'waiting_for_reconciliation',
       claimed_by = '',
       lease_expires = NULL,
       pending_turn = v.pending_turn::jsonb,
       ledger_head = v.ledger_head,
       next_sequence = v.next_sequence,
       updated_at = STATEMENT_TIMESTAMP()
  FROM jsonb_to_recordset(%(runs)s::jsonb) AS v(
           id bigint, pending_turn text, ledger_head text, next_sequence integer)
 WHERE run.id = v.id
   AND run.status = 'running' AND run.lease_expires < STATEMENT_TIMESTAMP()
   AND run.pending_effect = 'non_idempotent_write'
RETURNING run.id;


-- reap_failed --
-- End each stale run failed with its reason and error; claim, lease, fence, pending turn and
-- output cleared; finished now.
-- Guard: running and lease_expires before the clock.
UPDATE agentruns_agentrun AS run
   SET status = 'failed',
       termination_reason = v.termination_reason,
       error = v.error::jsonb,
       output = '',
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       pending_turn = NULL,
       finished_at = STATEMENT_TIMESTAMP(),
       ledger_head = v.ledger_head,
       next_sequence = v.next_sequence,
       updated_at = STATEMENT_TIMESTAMP()
  FROM jsonb_to_recordset(%(runs)s::jsonb) AS v(
           id bigint, termination_reason text, error text, ledger_head text,
           next_sequence integer)
 WHERE run.id = v.id
   AND run.status = 'running' AND run.lease_expires < STATEMENT_TIMESTAMP()
RETURNING run.id;


-- reap_reclaim --
-- Take each stale run back to the queue: queued, the retry budget spent by one, claim, lease
-- and fence cleared.
-- Guard: running and lease_expires before the clock.
UPDATE agentruns_agentrun AS run
   SET status = 'queued',
       requeue_count = run.requeue_count + 1,
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       ledger_head = v.ledger_head,
       next_sequence = v.next_sequence,
       updated_at = STATEMENT_TIMESTAMP()
  FROM jsonb_to_recordset(%(runs)s::jsonb) AS v(
           id bigint, ledger_head text, next_sequence integer)
 WHERE run.id = v.id
   AND run.status = 'running' AND run.lease_expires < STATEMENT_TIMESTAMP()
RETURNING run.id;
