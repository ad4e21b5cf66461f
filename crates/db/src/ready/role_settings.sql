-- The statement_timeout this session runs under, and the role it is logged in
-- as. Behind a transaction-mode pooler no startup options arrive, so this is
-- the login role's own setting ('0' when it sets none).
-- No parameters.
SELECT current_setting('statement_timeout') AS statement_timeout,
       current_user::text AS role
