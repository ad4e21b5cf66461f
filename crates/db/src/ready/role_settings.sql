-- The settings this session runs under that a transaction-mode pooler leaves
-- to the login role (it passes no startup options): the statement_timeout
-- ('0' when nothing sets one) and the search_path, as set and as the schemas
-- it resolves names in (those that exist, the implicit pg_catalog left out),
-- with the role it is logged in as. Every name is qualified: this is what
-- tells whether the session's search_path is safe, so it must not itself
-- resolve anything through it.
-- No parameters.
SELECT pg_catalog.current_setting('statement_timeout') AS statement_timeout,
       current_user::pg_catalog.text AS role,
       pg_catalog.current_setting('search_path') AS search_path,
       pg_catalog.current_schemas(false)::pg_catalog.text[] AS schemas
