v_committing := clock_timestamp();
COMMIT;
-- How long the commit waited (merging's places follow it). Past the
-- COMMIT the pinned settings are gone: every name here is qualified.
o_commit_us := platformkit.platformkit_us(pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.-) platformkit.platformkit_us(v_committing);
