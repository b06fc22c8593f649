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

-- A kernel's family: its name without `void `, template arguments and parameter list, architecture
-- tokens (`volta_`, `ampere_`, `sm80_`, ...) masked as `ARCH_` and tile sizes (`128x64`) as `#`;
-- cuBLAS's `nvjet_*` kernels by their kind alone (`nvjet_ARCH_tst`: cluster shape, cooperative mode
-- and layout follow the tile). One routine renamed by its template arguments, its architecture or
-- the tile configuration a GEMM library picks per shape is one family, so the same matmul run whole
-- or in chunks matches: `ampere_sgemm_128x64_nn` -> `ARCH_sgemm_#_nn`. NULL stays NULL.
CREATE OR REPLACE MACRO kernel_family(name) AS
regexp_replace(
    regexp_replace(
        regexp_replace(
            regexp_replace(regexp_replace(name, '^void ', ''), '[<(].*$', ''),
            '(volta|turing|ampere|hopper|blackwell|sm[0-9]+[a-z]?)_', 'ARCH_', 'g'),
        '^(nvjet_ARCH_[a-z]+)_.*$', '\1'),
    '[0-9]+(x[0-9]+)+', '#', 'g');
