-- A migration whose comments were corrected after it was applied: its
-- history row's checksum of the text as first applied becomes the corrected
-- text's, so that refinery (which refuses an applied migration whose text
-- differs) still refuses every other difference.
-- $1: the version (int4); $2: the checksum of the text as first applied
-- (text); $3: the corrected text's (text).
UPDATE public.refinery_schema_history SET checksum = $3 WHERE version = $1 AND checksum = $2
