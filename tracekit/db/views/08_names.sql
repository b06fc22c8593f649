-- Name keys: host-side names with their per-run parts masked, for grouping and matching across runs.

-- `name` with its per-run parts masked, so one place has one key in every run (the SQL form of
-- `tracekit.db.names.name_key`, whose doc lists the masks): ` at 0x<hex>` dropped and other hex
-- numbers of six or more digits as `0x#`; the number after a counter label (`op_id`, `seq`, `id`,
-- `uid`, `request_id`, ... followed by `=`, `:` or a space) as `#`; a trailing `#N` dropped; a
-- trailing number of five or more digits after a separator as `#`. `nccl:all_reduce, op_id = 150891,
-- seq = 452673` -> `nccl:all_reduce, op_id = #, seq = #`; `layers.3`, shapes and kernel template
-- arguments stay as they are. NULL stays NULL.
CREATE OR REPLACE MACRO name_key(name) AS
regexp_replace(
    regexp_replace(
        regexp_replace(
            regexp_replace(
                regexp_replace(name, ' at 0x[0-9a-fA-F]+', '', 'g'),
                '0x[0-9a-fA-F]{6,}', '0x#', 'g'),
            '(^|[^0-9A-Za-z_])(op_id|seq|seq_num|seq_nr|seq_no|sequence_number|id|uid|call_id|request_id|req_id'
            || '|correlation|correlation_id)(\s*[=:]\s*|\s+)[0-9]+', '\1\2\3#', 'g'),
        '#[0-9]+$', ''),
    '([^0-9A-Za-z])[0-9]{5,}$', '\1#');
