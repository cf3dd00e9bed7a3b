-- prologue
IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL OR pg_catalog.pg_is_in_recovery() THEN
    RAISE EXCEPTION USING
        ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
        MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
            THEN 'platformkit: this server is a standby; the limiter counts on the primary'
            ELSE 'platformkit: a limiter procedure must be a statement of its own, outside any transaction'
            END;
END IF;
COMMIT;
SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
        pg_catalog.set_config('platformkit.system', 'on', true),
        pg_catalog.set_config('lock_timeout', p_budget_ms::pg_catalog.text, true),
        pg_catalog.set_config('row_security', 'on', true),
        pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true),
        pg_catalog.set_config('synchronous_commit', 'on', true),
        pg_catalog.set_config('enable_seqscan', 'off', true),
        pg_catalog.set_config('enable_indexscan', 'on', true),
        pg_catalog.set_config('enable_bitmapscan', 'off', true),
        pg_catalog.set_config('enable_nestloop', 'on', true),
        pg_catalog.set_config('seq_page_cost', '1', true),
        pg_catalog.set_config('random_page_cost', '4', true),
        pg_catalog.set_config('cpu_tuple_cost', '0.01', true),
        pg_catalog.set_config('cpu_index_tuple_cost', '0.005', true),
        pg_catalog.set_config('cpu_operator_cost', '0.0025', true),
        pg_catalog.set_config('max_parallel_workers_per_gather', '0', true),
        pg_catalog.set_config('jit', 'off', true);
-- A quarter of the budget for each of an upsert's at most four lock waits.
PERFORM pg_catalog.set_config('lock_timeout', GREATEST(p_budget_ms / 4, 1)::text, true);
IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
   OR (current_setting('statement_timeout') <> '0'
       AND current_setting('statement_timeout')::interval
           <= p_budget_ms * interval '1 millisecond')
   OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
       AND current_setting('transaction_timeout', true)::interval
           <= p_budget_ms * interval '1 millisecond')
   OR (current_setting('default_transaction_isolation') = 'serializable'
       AND current_setting('default_transaction_read_only') = 'on'
       AND current_setting('default_transaction_deferrable') = 'on')
   OR current_setting('transaction_read_only') <> 'off' THEN
    RAISE EXCEPTION USING
        ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
        MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
            THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, a SERIALIZABLE READ ONLY DEFERRABLE default, or a read-only transaction on a primary'
            ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
            END;
END IF;
-- end of prologue
