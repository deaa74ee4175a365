-- SQLite overrides, where only SQLite has a way. Claims need none: writes run under BEGIN
-- IMMEDIATE, so a claim's SELECT and UPDATE already see no competitor.

-- name: growth_file
-- The file's size and its free pages (kept for reuse; VACUUM gives them back to the
-- filesystem), and whether the file is to be split table by table: the build has the
-- `dbstat` table (SQLITE_ENABLE_DBSTAT_VTAB, as Debian's and the python.org builds do) and
-- the file is small enough. Splitting reads every page of the file, on the reader thread the
-- API's reads share (a tenth of a second or more per 100 MiB): a file over `split_max`
-- bytes is reported whole.
SELECT page_count * page_size AS bytes,
       freelist_count * page_size AS free_bytes,
       page_count * page_size <= :split_max
       AND EXISTS (SELECT 1 FROM pragma_compile_options
                    WHERE compile_options = 'ENABLE_DBSTAT_VTAB') AS split
  FROM pragma_page_count(), pragma_page_size(), pragma_freelist_count();

-- name: growth_tables
-- Each table's pages with its indexes' (an index's row in sqlite_master names its table; the
-- catalog, which has no row of its own, by its own name), then the free pages, then `*other`:
-- the pages of no table (incremental auto-vacuum's pointer maps). Each page of the file is
-- counted in one row, so the rows add up to the file's size. SQLite keeps no dead rows (a
-- deleted row's space is reused in place or freed), so none are counted.
SELECT coalesce(m.tbl_name, d.name) AS name, sum(d.pgsize) AS bytes, NULL AS live, NULL AS dead
  FROM dbstat AS d LEFT JOIN sqlite_master AS m ON m.name = d.name
 GROUP BY coalesce(m.tbl_name, d.name)
UNION ALL
SELECT '*free', :free_bytes, NULL, NULL
UNION ALL
SELECT '*other', :bytes - :free_bytes - (SELECT coalesce(sum(pgsize), 0) FROM dbstat), NULL, NULL;

-- name: growth_tables_whole_file
-- `growth_tables` for a file that is not split (no dbstat, or too large): the tables together
-- as `*`, then the free pages.
SELECT '*' AS name, :bytes - :free_bytes AS bytes, NULL AS live, NULL AS dead
UNION ALL
SELECT '*free', :free_bytes, NULL, NULL;
