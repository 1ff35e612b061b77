-- The hot INSERT of a batch paid for a per-row foreign-key trigger and for
-- locale-aware text comparison in every index probe (docs/performance.md).
-- Identifiers are ASCII by contract, so byte order ("C") loses nothing. The
-- foreign key guarded nothing the commit does not already check: a batch
-- that inserts holds also updates its SKU's counter row and fails unless
-- exactly one row changed.
ALTER TABLE reservations DROP CONSTRAINT reservations_tenant_sku_fkey;

ALTER TABLE reservations
    ALTER COLUMN tenant TYPE text COLLATE "C",
    ALTER COLUMN request_key TYPE text COLLATE "C",
    ALTER COLUMN sku TYPE text COLLATE "C",
    ALTER COLUMN user_id TYPE text COLLATE "C";
