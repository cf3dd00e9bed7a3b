VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = 0
SET row_security = on
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_indexscan = on
SET enable_bitmapscan = off
SET enable_nestloop = on
SET seq_page_cost = 1
SET random_page_cost = 4
SET cpu_tuple_cost = 0.01
SET cpu_index_tuple_cost = 0.005
SET cpu_operator_cost = 0.0025
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
DECLARE
    v_switch pg_catalog.text;
    v_set pg_catalog.text;
