-- Who may create objects in schema `public`, where the migrations create
-- their tables and resolve the functions and operators they call: a role
-- that may create there can shadow one of those with an exact match of its
-- argument types (CVE-2018-1058). Returns the schema's owner (no row when
-- there is no schema `public`) and every grantee of CREATE on it that is not
-- trusted, as a REVOKE names it: `PUBLIC` (every role; the default before
-- PostgreSQL 15) or the role's quoted name. Trusted: superusers, and roles
-- with the privileges of the schema's owner or of the migrating user (they
-- may act as those already). Run with search_path pg_catalog (migrate.rs).
-- No parameters.
SELECT n.nspowner::regrole::text AS owner,
       ARRAY(SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
               FROM aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) AS a
               LEFT JOIN pg_roles AS r ON r.oid = a.grantee
              WHERE a.privilege_type = 'CREATE'
                AND (a.grantee = 0
                     OR NOT (r.rolsuper
                             OR pg_has_role(a.grantee, n.nspowner, 'USAGE')
                             OR pg_has_role(a.grantee, current_user, 'USAGE')))
              ORDER BY a.grantee <> 0, 1) AS creators
  FROM pg_namespace AS n
 WHERE n.nspname = 'public'
