/* earmark upgrade script, 0.2.0 to 0.3.0
 *
 * ALTER EXTENSION earmark UPDATE runs it on a 0.2.0 database.  Every change
 * made to src/earmark.sql since 0.2.0 is made here too, so that an updated
 * database has exactly the schema of a fresh install
 * (test/integration/upgrade.sh compares them).
 */

\echo Use "ALTER EXTENSION earmark UPDATE" to load this file. \quit
