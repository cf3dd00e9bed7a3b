-- reader's prologue
-- Each refusal is behind a cheaper test it implies, all a good call pays for.
IF pg_catalog.pg_is_in_recovery()
   OR current_setting('transaction_isolation') <> 'read committed' THEN
    IF pg_catalog.pg_is_in_recovery()
       OR (current_setting('transaction_isolation') <> 'read committed'
           AND statement_timestamp() - transaction_timestamp() > interval '100 milliseconds') THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN pg_catalog.pg_is_in_recovery() THEN '25006' ELSE '2D000' END,
            MESSAGE = CASE WHEN pg_catalog.pg_is_in_recovery()
                THEN 'platformkit: this server is a standby; the limiter counts on the primary'
                ELSE 'platformkit: a read inside a caller''s REPEATABLE READ or SERIALIZABLE transaction begun over 100 ms ago could see counts that old'
                END;
    END IF;
END IF;
IF p_budget_ms IS NULL OR p_budget_ms NOT BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
   OR current_setting('statement_timeout') <> '0'
   OR COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
   OR current_setting('transaction_deferrable') <> 'off' THEN
    IF p_budget_ms IS NULL OR p_budget_ms < 1 OR p_budget_ms > platformkit.platformkit_max_budget_ms()
       OR (current_setting('statement_timeout') <> '0'
           AND current_setting('statement_timeout')::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (COALESCE(current_setting('transaction_timeout', true), '0') <> '0'
           AND current_setting('transaction_timeout', true)::interval
               <= p_budget_ms * interval '1 millisecond')
       OR (current_setting('transaction_isolation') = 'serializable'
           AND current_setting('transaction_read_only') = 'on'
           AND current_setting('transaction_deferrable') = 'on') THEN
        RAISE EXCEPTION USING
            ERRCODE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms() THEN 'PK001' ELSE '22023' END,
            MESSAGE = CASE WHEN p_budget_ms BETWEEN 1 AND platformkit.platformkit_max_budget_ms()
                THEN 'platformkit: a setting of the session would stop or hold the limiter''s call: a statement_timeout or transaction_timeout no longer than its budget, or a SERIALIZABLE READ ONLY DEFERRABLE transaction'
                ELSE 'platformkit: p_budget_ms must be 1 to ' || platformkit.platformkit_max_budget_ms()
                END;
    END IF;
END IF;
v_switch := current_setting('platformkit.system', true);
-- Assigned, here and at the end, not PERFORMed: an expression, not a query.
v_set := set_config('platformkit.system', 'on', true);
v_set := set_config('lock_timeout', p_budget_ms::pg_catalog.text, true);
-- end of reader's prologue
