//! SQL run against a server: the test roles, and one database per test.

use std::error::Error as _;
use std::fmt::Write as _;

use tokio_postgres::Config;
use tokio_postgres::error::SqlState;

use crate::connect;

/// The role that owns each test database and everything its schema creates.
pub(crate) const OWNER: &str = "limit_owner";
/// The role an application connects as: may read and write the tables, nothing more.
pub(crate) const TENANT: &str = "limit_tenant";
/// A login with no grants at all: what PUBLIC may do, nothing more.
pub(crate) const STRANGER: &str = "limit_stranger";

/// Key of the advisory lock serialising role setup among processes sharing a server.
const ROLE_SETUP_LOCK: i64 = 0x706b_6c69_6d69_7401;

/// Creates (or corrects) [`OWNER`], [`TENANT`] and [`STRANGER`]. All get the password of `admin`, if
/// it has one, so they can log in wherever the administrator can.
pub(crate) async fn ensure_roles(admin: &Config) {
    let client = connect(admin).await;
    let is_superuser: bool = client
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .map(|row| row.get(0))
        .unwrap_or_else(|e| {
            panic!(
                "checking the privileges of {}: {}",
                target(admin),
                describe(&e)
            )
        });
    assert!(
        is_superuser,
        "{} is not a superuser; the test harness needs one to create roles and databases \
         (DATABASE_URL must name a superuser)",
        target(admin)
    );

    let mut attributes =
        String::from("LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION");
    if let Some(password) = admin.get_password() {
        let password = String::from_utf8_lossy(password);
        write!(attributes, " PASSWORD {}", quote_literal(&password)).expect("writing to a String");
    }

    client
        .execute("SELECT pg_advisory_lock($1)", &[&ROLE_SETUP_LOCK])
        .await
        .unwrap_or_else(|e| panic!("taking the role setup lock: {}", describe(&e)));
    for role in [OWNER, TENANT, STRANGER] {
        match client
            .batch_execute(&format!("CREATE ROLE {role} {attributes}"))
            .await
        {
            Ok(()) => {}
            // Already there, possibly created concurrently by another process: make sure it
            // has exactly the attributes the tests rely on.
            Err(e)
                if e.code() == Some(&SqlState::DUPLICATE_OBJECT)
                    || e.code() == Some(&SqlState::UNIQUE_VIOLATION) =>
            {
                client
                    .batch_execute(&format!("ALTER ROLE {role} {attributes}"))
                    .await
                    .unwrap_or_else(|e| panic!("altering role {role}: {}", describe(&e)));
            }
            Err(e) => panic!("creating role {role}: {}", describe(&e)),
        }
    }
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&ROLE_SETUP_LOCK])
        .await
        .unwrap_or_else(|e| panic!("releasing the role setup lock: {}", describe(&e)));
}

/// Creates database `name` owned by [`OWNER`], lets [`TENANT`] use its tables, and applies
/// `schema` as [`OWNER`].
pub(crate) async fn create_database(
    admin: &Config,
    owner: &Config,
    name: &str,
    schema: Option<&str>,
) {
    let ident = quote_ident(name);
    let admin = connect(admin).await;
    // template0 is never connected to, so creation cannot fail because someone is.
    // (CREATE DATABASE cannot share a multi-statement batch: that is a transaction.)
    admin
        .batch_execute(&format!(
            "CREATE DATABASE {ident} OWNER {OWNER} TEMPLATE template0"
        ))
        .await
        .unwrap_or_else(|e| panic!("creating database {name}: {}", describe(&e)));
    admin
        .batch_execute(&format!("GRANT CONNECT ON DATABASE {ident} TO {TENANT}"))
        .await
        .unwrap_or_else(|e| panic!("granting {TENANT} access to {name}: {}", describe(&e)));

    let client = connect(owner).await;
    // As the database owner, which (through pg_database_owner) owns schema public. Default
    // privileges also cover tables a test creates later, e.g. by running migrations.
    client
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA public TO {TENANT};
             ALTER DEFAULT PRIVILEGES IN SCHEMA public
                 GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {TENANT};"
        ))
        .await
        .unwrap_or_else(|e| panic!("granting {TENANT} access to {name}: {}", describe(&e)));
    if let Some(schema) = schema {
        client.batch_execute(schema).await.unwrap_or_else(|e| {
            panic!(
                "applying the schema to database {name} as {OWNER}: {}\n--- schema ---\n{schema}",
                describe(&e)
            )
        });
        // Every schema the script created (and public): USAGE, its tables'
        // rows, and EXECUTE on its routines, as an application role has.
        client
            .batch_execute(&format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {TENANT};
                 DO $$
                 DECLARE s name;
                 BEGIN
                     FOR s IN SELECT nspname FROM pg_catalog.pg_namespace
                              WHERE nspowner = current_user::regrole
                                AND nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
                     LOOP
                         EXECUTE format('GRANT USAGE ON SCHEMA %I TO {TENANT}', s);
                         EXECUTE format(
                             'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I TO {TENANT}', s);
                         EXECUTE format('GRANT EXECUTE ON ALL ROUTINES IN SCHEMA %I TO {TENANT}', s);
                     END LOOP;
                 END
                 $$;"
            ))
            .await
            .unwrap_or_else(|e| panic!("granting {TENANT} the tables of {name}: {}", describe(&e)));
    }
    // The set-up session has ended before the database is handed over: a
    // test that lists its database's backends finds only its own.
    let pid: i32 = client
        .query_one("SELECT pg_catalog.pg_backend_pid()", &[])
        .await
        .unwrap_or_else(|e| panic!("the set-up session of {name}: {}", describe(&e)))
        .get(0);
    drop(client);
    let deadline = crate::Deadline::after(SESSION_END);
    loop {
        let open: bool = admin
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity WHERE pid = $1)",
                &[&pid],
            )
            .await
            .unwrap_or_else(|e| panic!("reading pg_stat_activity: {}", describe(&e)))
            .get(0);
        if !open {
            break;
        }
        assert!(
            !deadline.passed(),
            "the set-up session of {name} (backend {pid}) did not end within {SESSION_END:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// How long [`create_database`] waits for its set-up session to end.
const SESSION_END: std::time::Duration = std::time::Duration::from_secs(30);

/// `user@host:port/dbname`, for messages.
pub(crate) fn target(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "<default host>".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{}@{host}:{port}/{}",
        config.get_user().unwrap_or("<no user>"),
        config.get_dbname().unwrap_or("<default database>")
    )
}

/// A readable account of a client error, including the server's detail and hint.
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        let mut text = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(detail) = db.detail() {
            write!(text, "; DETAIL: {detail}").expect("writing to a String");
        }
        if let Some(hint) = db.hint() {
            write!(text, "; HINT: {hint}").expect("writing to a String");
        }
        if let Some(context) = db.where_() {
            write!(text, "; CONTEXT: {context}").expect("writing to a String");
        }
        if let Some(position) = db.position() {
            write!(text, "; POSITION: {position:?}").expect("writing to a String");
        }
        return text;
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        write!(text, ": {cause}").expect("writing to a String");
        source = cause.source();
    }
    text
}

fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

fn quote_literal(literal: &str) -> String {
    format!("'{}'", literal.replace('\'', "''"))
}
