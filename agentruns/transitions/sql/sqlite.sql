-- The guarded statements of agentruns.transitions on SQLite (docs/design.md §2): the names of
-- postgresql.sql, for SQLite 3.35 or later (RETURNING, UPDATE … FROM). Read once by
-- agentruns.transitions._statements.
--
-- Format: each statement starts with a line "-- name --", then comment lines saying what it
-- writes and its guard, then the SQL. Parameters are bound by name: %(name)s; a literal % is
-- written %%.
--
-- Conventions:
-- * The clock is the database's, as Django writes Now() on SQLite (text, milliseconds):
--   STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'). A deadline is that clock plus a number of
--   seconds, written with microseconds as Django writes a datetime ("… || '000'"), so that it
--   compares as text with Now() exactly like one the ORM wrote.
-- * A parameter named after a column of the run holds that column's value, adapted by its model
--   field (JSON text and decimals as Django writes them). %(owner)s and %(epoch)s are a lease's
--   claimed_by and lease_epoch.
-- * COALESCE(%(column)s, column): the value when one is given, else the column kept.
-- * A segment's or a decision's events are numbered and chained before the statement runs
--   (agentruns.ledger); %(head)s and %(next_sequence)s are the run's ledger tail after them
--   (NULL: no events, the tail kept), %(first_sequence)s the sequence the first takes. SQLite
--   has no data-modifying CTE: the events are appended by append_events, after the statement
--   and in its transaction (an IMMEDIATE one: no other writer in between).
-- * No row returned: the guard matched nothing, and nothing was written.


-- heartbeat --
-- A segment's step boundary: renew the lease; save the loop state and the run's cost so far
-- when given.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
UPDATE agentruns_agentrun
   SET lease_expires = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW',
                                printf('%%+.3f seconds', %(lease_seconds)s)) || '000',
       loop_state = COALESCE(%(loop_state)s, loop_state),
       cost = COALESCE(%(cost)s, cost),
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
   AND (%(first_sequence)s IS NULL OR next_sequence = %(first_sequence)s)
RETURNING id;


-- stamp_fence --
-- Before a write runs: stamp its effect and call on the run (the fence); renew the lease; save
-- the loop state when given.
-- Guard: the owner (running, claimed_by, lease_epoch).
UPDATE agentruns_agentrun
   SET pending_effect = %(pending_effect)s,
       pending_call = %(pending_call)s,
       lease_expires = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW',
                                printf('%%+.3f seconds', %(lease_seconds)s)) || '000',
       loop_state = COALESCE(%(loop_state)s, loop_state),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
RETURNING id;


-- clear_fence --
-- After a write ran: clear the fence; renew the lease; save the loop state and the cost when
-- given.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
UPDATE agentruns_agentrun
   SET pending_effect = '',
       pending_call = NULL,
       lease_expires = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW',
                                printf('%%+.3f seconds', %(lease_seconds)s)) || '000',
       loop_state = COALESCE(%(loop_state)s, loop_state),
       cost = COALESCE(%(cost)s, cost),
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
   AND (%(first_sequence)s IS NULL OR next_sequence = %(first_sequence)s)
RETURNING id;


-- suspend --
-- Park a running run in %(status)s (waiting_for_approval or waiting_for_input) with its pending
-- turn, the claim and lease released; its approval deadline the clock plus %(wait_seconds)s
-- (NULL: none) with its action, an earlier wait's escalation cleared; the loop state saved, the
-- cost when given. Returns the parked row.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
UPDATE agentruns_agentrun
   SET status = %(status)s,
       pending_turn = %(pending_turn)s,
       claimed_by = '',
       lease_expires = NULL,
       approval_deadline = CASE WHEN %(wait_seconds)s IS NULL THEN NULL
           ELSE STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW',
                         printf('%%+.3f seconds', %(wait_seconds)s)) || '000' END,
       approval_timeout_action = %(approval_timeout_action)s,
       escalated_at = NULL,
       escalated_to_id = NULL,
       loop_state = %(loop_state)s,
       cost = COALESCE(%(cost)s, cost),
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
   AND (%(first_sequence)s IS NULL OR next_sequence = %(first_sequence)s)
RETURNING *;


-- park_in_doubt --
-- Park a running run whose non-idempotent write has an unknown outcome in
-- waiting_for_reconciliation with its reconciliation turn; the claim and lease released, the
-- fence kept (it names the call); the loop state saved.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
UPDATE agentruns_agentrun
   SET status = 'waiting_for_reconciliation',
       pending_turn = %(pending_turn)s,
       claimed_by = '',
       lease_expires = NULL,
       loop_state = %(loop_state)s,
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
   AND (%(first_sequence)s IS NULL OR next_sequence = %(first_sequence)s)
RETURNING id;


-- requeue --
-- Hand a failed running run back to the queue for a retry: queued, the retry budget spent by
-- one, claim, lease and fence cleared, the error kept.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
UPDATE agentruns_agentrun
   SET status = 'queued',
       requeue_count = requeue_count + 1,
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       error = %(error)s,
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
   AND (%(first_sequence)s IS NULL OR next_sequence = %(first_sequence)s)
RETURNING id;


-- hand_back --
-- Hand a running run back to the queue because its worker is stopping: queued, claim, lease
-- and fence cleared, the retry budget untouched; the loop state saved, the cost when given.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
UPDATE agentruns_agentrun
   SET status = 'queued',
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       loop_state = %(loop_state)s,
       cost = COALESCE(%(cost)s, cost),
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
   AND (%(first_sequence)s IS NULL OR next_sequence = %(first_sequence)s)
RETURNING id;


-- settle_own --
-- A segment ends its run: %(status)s (terminal) with its reason, output and error; claim,
-- lease, fence and pending turn cleared; finished now; the totals (tokens, cost, rounds, the
-- loop state, a structured answer) when given.
-- Guard: the owner (running, claimed_by, lease_epoch) and, with events, the next sequence.
UPDATE agentruns_agentrun
   SET status = %(status)s,
       termination_reason = %(termination_reason)s,
       output = %(output)s,
       error = %(error)s,
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       pending_turn = NULL,
       finished_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       prompt_tokens = COALESCE(%(prompt_tokens)s, prompt_tokens),
       completion_tokens = COALESCE(%(completion_tokens)s, completion_tokens),
       total_tokens = COALESCE(%(total_tokens)s, total_tokens),
       cost = COALESCE(%(cost)s, cost),
       iterations = COALESCE(%(iterations)s, iterations),
       truncated = COALESCE(%(truncated)s, truncated),
       loop_state = COALESCE(%(loop_state)s, loop_state),
       output_object = COALESCE(%(output_object)s, output_object),
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND claimed_by = %(owner)s AND lease_epoch = %(epoch)s
   AND (%(first_sequence)s IS NULL OR next_sequence = %(first_sequence)s)
RETURNING id;


-- claim --
-- A worker claims the queued run named by %(uuid)s: running, claimed by %(owner)s until the
-- clock plus the lease, epoch %(epoch)s, started now unless it started before. Returns the row
-- as claimed.
-- Guard: queued, driven by %(external_framework)s ('' for Leasehold's own loop: a worker
-- never claims a run an external agent loop drives, nor that loop a native run), and the tail
-- its event is chained from, as the claim expects it: lease_epoch, next_sequence, ledger_head.
UPDATE agentruns_agentrun
   SET status = 'running',
       claimed_by = %(owner)s,
       lease_expires = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW',
                                printf('%%+.3f seconds', %(lease_seconds)s)) || '000',
       lease_epoch = %(epoch)s,
       started_at = COALESCE(started_at, STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')),
       ledger_head = %(head)s,
       next_sequence = %(next_sequence)s,
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE uuid = %(uuid)s
   AND status = 'queued'
   AND external_framework = %(external_framework)s
   AND lease_epoch = %(expected_epoch)s
   AND next_sequence = %(first_sequence)s
   AND ledger_head = %(expected_head)s
RETURNING *;


-- lock_waiting_run --
-- A decision's read (it writes nothing): the run %(uuid)s, in the decision's IMMEDIATE
-- transaction (SQLite has no row locks: the transaction holds the database), with its
-- configuration and that configuration's approver group (id, name) in the same statement, for
-- the decision to check and record (transitions.deciding).
-- No row: no such run.
SELECT run.*, configuration.*,
       approver_group.id AS approver_group_id, approver_group.name AS approver_group_name
  FROM agentruns_agentrun AS run
  JOIN agentruns_agentconfiguration AS configuration
    ON configuration.id = run.configuration_id
  LEFT JOIN auth_group AS approver_group
    ON approver_group.id = configuration.approver_group_id
 WHERE run.uuid = %(uuid)s;


-- decide_queue --
-- A decision on a waiting run (read and checked under its row lock), handed to a worker:
-- queued with the decision in its loop state; pending turn, fence and approval deadline
-- cleared. Returns the row as decided.
-- Guard: status %(status)s (the status the decision was made on).
UPDATE agentruns_agentrun
   SET status = 'queued',
       loop_state = %(loop_state)s,
       pending_turn = NULL,
       pending_effect = '',
       pending_call = NULL,
       approval_deadline = NULL,
       approval_timeout_action = '',
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s AND status = %(status)s
RETURNING *;


-- decide_resume --
-- A decision on a waiting run (read and checked under its row lock), continued inline:
-- running, claimed by %(owner)s until the clock plus the lease, epoch %(epoch)s, the decision
-- in its loop state; pending turn, fence and approval deadline cleared. Returns the row as
-- decided.
-- Guard: status %(status)s (the status the decision was made on).
UPDATE agentruns_agentrun
   SET status = 'running',
       claimed_by = %(owner)s,
       lease_expires = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW',
                                printf('%%+.3f seconds', %(lease_seconds)s)) || '000',
       lease_epoch = %(epoch)s,
       loop_state = %(loop_state)s,
       pending_turn = NULL,
       pending_effect = '',
       pending_call = NULL,
       approval_deadline = NULL,
       approval_timeout_action = '',
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s AND status = %(status)s
RETURNING *;


-- reconcile_abandon --
-- An operator gives up on an in-doubt run (read and checked under its row lock): failed /
-- reconciled_abandoned, the verdict in its loop state; pending turn, claim, lease and fence
-- cleared; finished now. Returns the row as settled.
-- Guard: waiting_for_reconciliation.
UPDATE agentruns_agentrun
   SET status = 'failed',
       termination_reason = 'reconciled_abandoned',
       loop_state = %(loop_state)s,
       pending_turn = NULL,
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       finished_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s AND status = 'waiting_for_reconciliation'
RETURNING *;


-- note_check --
-- A tool's automatic check records where it stands on an in-doubt run (read under its row
-- lock): the pending turn rewritten with the check's status.
-- Guard: waiting_for_reconciliation.
UPDATE agentruns_agentrun
   SET pending_turn = %(pending_turn)s,
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s AND status = 'waiting_for_reconciliation'
RETURNING id;


-- expire_deny --
-- The approval deadline of a waiting run passed (read under its row lock): the turn denied on
-- the deadline's behalf (the denial in the loop state), queued for a worker; pending turn,
-- claim, lease and the deadline with its action cleared.
-- Guard: status %(status)s, one that has a deadline, and the deadline before the clock.
UPDATE agentruns_agentrun
   SET status = 'queued',
       loop_state = %(loop_state)s,
       pending_turn = NULL,
       claimed_by = '',
       lease_expires = NULL,
       approval_deadline = NULL,
       approval_timeout_action = '',
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s AND status = %(status)s
   AND status IN ('waiting_for_approval', 'waiting_for_input')
   AND approval_deadline < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
RETURNING id;


-- expire_fail --
-- The approval deadline of a waiting run passed (read under its row lock) and it fails:
-- failed / approval_expired with the error; pending turn, claim, lease, fence and the deadline
-- with its action cleared; finished now.
-- Guard: status %(status)s, one that has a deadline, and the deadline before the clock.
UPDATE agentruns_agentrun
   SET status = 'failed',
       termination_reason = 'approval_expired',
       error = %(error)s,
       loop_state = %(loop_state)s,
       pending_turn = NULL,
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       approval_deadline = NULL,
       approval_timeout_action = '',
       finished_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s AND status = %(status)s
   AND status IN ('waiting_for_approval', 'waiting_for_input')
   AND approval_deadline < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
RETURNING id;


-- escalate --
-- The approval deadline of a waiting run whose action is escalate passed (read under its row
-- lock): handed to the escalation group %(escalated_to_id)s now, a second deadline the clock
-- plus %(wait_seconds)s with the final action; it keeps waiting.
-- Guard: status %(status)s, one that has a deadline, the deadline before the clock, and the
-- action escalate.
UPDATE agentruns_agentrun
   SET approval_deadline = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW',
                                    printf('%%+.3f seconds', %(wait_seconds)s)) || '000',
       approval_timeout_action = %(approval_timeout_action)s,
       escalated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       escalated_to_id = %(escalated_to_id)s,
       ledger_head = COALESCE(%(head)s, ledger_head),
       next_sequence = COALESCE(%(next_sequence)s, next_sequence),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s AND status = %(status)s
   AND status IN ('waiting_for_approval', 'waiting_for_input')
   AND approval_deadline < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
   AND approval_timeout_action = 'escalate'
RETURNING id;


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
       error = %(error)s,
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       pending_turn = NULL,
       finished_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       prompt_tokens = COALESCE(%(prompt_tokens)s, prompt_tokens),
       completion_tokens = COALESCE(%(completion_tokens)s, completion_tokens),
       total_tokens = COALESCE(%(total_tokens)s, total_tokens),
       cost = COALESCE(%(cost)s, cost),
       iterations = COALESCE(%(iterations)s, iterations),
       truncated = COALESCE(%(truncated)s, truncated),
       loop_state = COALESCE(%(loop_state)s, loop_state),
       output_object = COALESCE(%(output_object)s, output_object),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
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
       error = %(error)s,
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       pending_turn = NULL,
       finished_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       prompt_tokens = COALESCE(%(prompt_tokens)s, prompt_tokens),
       completion_tokens = COALESCE(%(completion_tokens)s, completion_tokens),
       total_tokens = COALESCE(%(total_tokens)s, total_tokens),
       cost = COALESCE(%(cost)s, cost),
       iterations = COALESCE(%(iterations)s, iterations),
       truncated = COALESCE(%(truncated)s, truncated),
       loop_state = COALESCE(%(loop_state)s, loop_state),
       output_object = COALESCE(%(output_object)s, output_object),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND lease_expires < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
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
       finished_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
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
       finished_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
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
       error = %(error)s,
       claimed_by = '',
       lease_expires = NULL,
       pending_turn = NULL,
       finished_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
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
       cost = COALESCE(%(cost)s, cost),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
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
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND lease_expires < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
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
       pending_turn = %(pending_turn)s,
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'running' AND lease_expires < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
   AND pending_effect = 'non_idempotent_write'
RETURNING id, uuid, ledger_head, next_sequence;


-- settle_undispatched --
-- A run the reaper took back whose wake-up could not be sent: failed / not_retryable with the
-- error, pending turn cleared, finished now.
-- Guard: queued, unclaimed and still at the epoch the reclaim left (%(lease_epoch)s).
UPDATE agentruns_agentrun
   SET status = 'failed',
       termination_reason = 'not_retryable',
       error = %(error)s,
       pending_turn = NULL,
       finished_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'queued' AND claimed_by = '' AND lease_epoch = %(lease_epoch)s
RETURNING id, uuid, ledger_head, next_sequence;


-- mark_redispatched --
-- The reaper is about to send a queued run nobody claimed a fresh wake-up: updated_at bumped
-- (the next redispatch waits a whole period).
-- Guard: queued, unclaimed, and not touched for %(older_than_seconds)s by the clock.
UPDATE agentruns_agentrun
   SET updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
 WHERE id = %(run_id)s
   AND status = 'queued' AND claimed_by = ''
   AND updated_at < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW',
                             printf('%%+.3f seconds', -%(older_than_seconds)s)) || '000'
RETURNING id, uuid, ledger_head, next_sequence;


-- append_events --
-- Append events (%(events)s: a JSON array, one element per event naming its run, the payload
-- as JSON text inside it) numbered and chained by the caller, in the transaction of the
-- guarded write that holds their runs.
INSERT INTO agentruns_agentrunevent
       (run_id, sequence, kind, segment, lease_epoch, duration_ms, payload, actor_id,
        created_at, actor_ref, prev_hash, hash, ledger_version, ledger_key)
SELECT json_extract(e.value, '$.run'), json_extract(e.value, '$.sequence'),
       json_extract(e.value, '$.kind'), json_extract(e.value, '$.segment'),
       json_extract(e.value, '$.lease_epoch'), json_extract(e.value, '$.duration_ms'),
       json_extract(e.value, '$.payload'), json_extract(e.value, '$.actor'),
       json_extract(e.value, '$.created_at'), json_extract(e.value, '$.actor'),
       json_extract(e.value, '$.prev_hash'), json_extract(e.value, '$.hash'),
       json_extract(e.value, '$.ledger_version'), json_extract(e.value, '$.ledger_key')
  FROM json_each(%(events)s) AS e;


-- write_tail --
-- The run's ledger head and next sequence after the events just appended, in the transaction
-- of the guarded write that holds its row.
UPDATE agentruns_agentrun
   SET ledger_head = %(head)s,
       next_sequence = %(next_sequence)s
 WHERE id = %(run_id)s;


-- The reaper's batches: one statement per verdict for many runs it holds (the batch's
-- IMMEDIATE transaction), each run's own values in %(runs)s (a JSON array, one element per
-- run, JSON columns as JSON text inside it), the guard checked row by row. Returns the ids of
-- the runs taken; their reaper events are appended after (append_events), chained before (the
-- new tails are in %(runs)s).


-- reap_in_doubt --
-- Park each stale run caught mid non-idempotent write in waiting_for_reconciliation with its
-- reconciliation turn; claim and lease cleared, the fence kept for the reconciler.
-- Guard: running, lease_expires before the clock, and the fence non_idempotent_write.
UPDATE agentruns_agentrun AS run
   SET status = 'waiting_for_reconciliation',
       claimed_by = '',
       lease_expires = NULL,
       pending_turn = v.pending_turn,
       ledger_head = v.ledger_head,
       next_sequence = v.next_sequence,
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
  FROM (SELECT json_extract(value, '$.id') AS id,
               json_extract(value, '$.pending_turn') AS pending_turn,
               json_extract(value, '$.ledger_head') AS ledger_head,
               json_extract(value, '$.next_sequence') AS next_sequence
          FROM json_each(%(runs)s)) AS v
 WHERE run.id = v.id
   AND run.status = 'running'
   AND run.lease_expires < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
   AND run.pending_effect = 'non_idempotent_write'
RETURNING id;


-- reap_failed --
-- End each stale run failed with its reason and error; claim, lease, fence, pending turn and
-- output cleared; finished now.
-- Guard: running and lease_expires before the clock.
UPDATE agentruns_agentrun AS run
   SET status = 'failed',
       termination_reason = v.termination_reason,
       error = v.error,
       output = '',
       claimed_by = '',
       lease_expires = NULL,
       pending_effect = '',
       pending_call = NULL,
       pending_turn = NULL,
       finished_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'),
       ledger_head = v.ledger_head,
       next_sequence = v.next_sequence,
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
  FROM (SELECT json_extract(value, '$.id') AS id,
               json_extract(value, '$.termination_reason') AS termination_reason,
               json_extract(value, '$.error') AS error,
               json_extract(value, '$.ledger_head') AS ledger_head,
               json_extract(value, '$.next_sequence') AS next_sequence
          FROM json_each(%(runs)s)) AS v
 WHERE run.id = v.id
   AND run.status = 'running'
   AND run.lease_expires < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
RETURNING id;


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
       updated_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
  FROM (SELECT json_extract(value, '$.id') AS id,
               json_extract(value, '$.ledger_head') AS ledger_head,
               json_extract(value, '$.next_sequence') AS next_sequence
          FROM json_each(%(runs)s)) AS v
 WHERE run.id = v.id
   AND run.status = 'running'
   AND run.lease_expires < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
RETURNING id;
