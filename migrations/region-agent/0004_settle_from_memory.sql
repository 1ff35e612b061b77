-- Each SKU owner keeps its live holds in memory, loaded at start, and
-- expires the due ones by key (docs/performance.md). Nothing reads holds by
-- expiry any more, so the index, one more B-tree insert per hold, goes.
DROP INDEX reservations_held_by_expiry;
