-- The per-user limit across regions (docs/protocol.md, "Per-user limit
-- across regions").

ALTER TABLE sku_stock ADD COLUMN user_limit_scope text NOT NULL DEFAULT 'region'
    CHECK (user_limit_scope IN ('region', 'global'));

-- A home region lends a user's place as a reservation row with status
-- LENT (key '/lend/{borrow id}', qty 1, no units behind it), so the
-- one-active-per-user index keeps a user's holds and loans together to
-- one, as it keeps holds to one. RETURNED: the place is back; the row
-- stays so the same borrow id is never lent again.
ALTER TABLE reservations DROP CONSTRAINT reservations_status_check;
ALTER TABLE reservations ADD CONSTRAINT reservations_status_check
    CHECK (status IN ('HELD', 'SOLD', 'RELEASED', 'EXPIRED', 'LENT', 'RETURNED'));

DROP INDEX reservations_one_active_per_user;
CREATE UNIQUE INDEX reservations_one_active_per_user
    ON reservations (tenant, sku, user_id)
    WHERE status IN ('HELD', 'SOLD', 'LENT');

-- A borrowing region's outbox: a place asked of the user's home (ASKED,
-- written before the ask is sent), used by a hold (USED, in the hold's
-- own commit), or to give back (RETURN). A USED place whose hold ended
-- unsold is given back too; a row goes once the coordinator confirms the
-- place is home again.
CREATE TABLE borrows (
    id           text COLLATE "C" PRIMARY KEY,
    tenant       text COLLATE "C" NOT NULL,
    sku          text COLLATE "C" NOT NULL,
    user_id      text COLLATE "C" NOT NULL,
    request_key  text COLLATE "C" NOT NULL,
    home         text NOT NULL,
    state        text NOT NULL CHECK (state IN ('ASKED', 'USED', 'RETURN')),
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX borrows_by_state ON borrows (state);
