//! Migrations that transform data, run on a database that holds some: what `0008_root_ref_writes`
//! keeps of the root-ref balance history (the current balances) and how it sets the nodes'
//! `rooted` flag, and how `0010_large_held_bytes_apart` moves large held bytes beside their rows,
//! on SQLite and on Postgres.

use std::collections::BTreeSet;

use anyhow::Context;
use tests::*;

/// A pool on the environment's database, created empty.
async fn empty_database(env: &TestEnv, b: Backend) -> anyhow::Result<sqlx::AnyPool> {
    sqlx::any::install_default_drivers();
    let url = match b.db {
        Db::Postgres => env.vars["UNICAS_DATABASE_URL"].clone(),
        Db::Sqlite => {
            let dir = &env.vars["UNICAS_DATA_DIR"];
            std::fs::create_dir_all(dir)?;
            format!("sqlite://{dir}/unicas.db?mode=rwc")
        }
    };
    sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .with_context(|| format!("opening {url}"))
}

/// Applies the service's migrations of `dialect` whose file names `keep` keeps, in order.
async fn apply(
    db: &sqlx::AnyPool,
    dialect: &str,
    keep: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    let dir = format!("{}/../migrations/{dialect}", env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    files.sort();
    for f in files.iter().filter(|f| keep(f)) {
        let sql = std::fs::read_to_string(format!("{dir}/{f}"))?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(db)
            .await
            .with_context(|| format!("migration {f}"))?;
    }
    Ok(())
}

/// The migrations' directory name of a backend's database.
fn dialect(b: Backend) -> &'static str {
    match b.db {
        Db::Postgres => "postgres",
        Db::Sqlite => "sqlite",
    }
}

async fn balance_history_becomes_current_balances(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let db = empty_database(&env, b).await?;
    let dialect = dialect(b);
    apply(&db, dialect, |f| f < "0008").await?;
    let h = |i: u8| vec![i; 32];
    sqlx::query("INSERT INTO apps (app_id, issuer, revision, created_at) VALUES ('a', 'i', 4, 0)")
        .execute(&db)
        .await?;
    // Node 1: counted 2, history 1 then 2; node 2: counted 0, its balance closed; node 3:
    // counted 1 from another domain.
    for (i, count) in [(1u8, 2i64), (2, 0), (3, 1)] {
        sqlx::query(
            "INSERT INTO nodes (app_id, space_id, hash, size, content_type, ref_count, \
             object_gen, encoding, stored_bytes, lease_started_at, lease_expires_at, \
             root_ref_count, created_at) VALUES ('a', 's', $1, 1, 'raw', 0, 'g', 'identity', 1, \
             0, 0, $2, 0)",
        )
        .bind(h(i))
        .bind(count)
        .execute(&db)
        .await?;
    }
    for (i, domain, count, from, to) in [
        (1u8, "default", 1i64, 1i64, Some(3i64)),
        (1, "default", 2, 3, None),
        (2, "default", 1, 1, Some(2)),
        (3, "other", 1, 4, None),
    ] {
        sqlx::query(
            "INSERT INTO root_ref_balances (app_id, space_id, ref_domain, hash, ref_count, \
             revision_from, revision_to) VALUES ('a', 's', $1, $2, $3, $4, $5)",
        )
        .bind(domain)
        .bind(h(i))
        .bind(count)
        .bind(from)
        .bind(to)
        .execute(&db)
        .await?;
    }
    apply(&db, dialect, |f| f.starts_with("0008")).await?;
    let balances: BTreeSet<(String, Vec<u8>, i64)> =
        sqlx::query_as("SELECT ref_domain, hash, ref_count FROM root_ref_balances")
            .fetch_all(&db)
            .await?
            .into_iter()
            .collect();
    assert_eq!(
        balances,
        BTreeSet::from([
            ("default".to_string(), h(1), 2),
            ("other".to_string(), h(3), 1)
        ]),
        "the current balances, and only they"
    );
    assert!(
        sqlx::query("SELECT revision_to FROM root_ref_balances")
            .fetch_all(&db)
            .await
            .is_err(),
        "the history's columns are gone"
    );
    let rooted: BTreeSet<(Vec<u8>, i64)> =
        sqlx::query_as("SELECT hash, CAST(rooted AS BIGINT) FROM nodes")
            .fetch_all(&db)
            .await?
            .into_iter()
            .collect();
    assert_eq!(rooted, BTreeSet::from([(h(1), 1), (h(2), 0), (h(3), 1)]));
    // One balance per (partition, domain, hash).
    let again = sqlx::query(
        "INSERT INTO root_ref_balances (app_id, space_id, ref_domain, hash, ref_count) \
         VALUES ('a', 's', 'default', $1, 5)",
    )
    .bind(h(1))
    .execute(&db)
    .await;
    assert!(again.is_err(), "a second balance of one key is refused");
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn balance_history_becomes_current_balances_sqlite() -> anyhow::Result<()> {
    balance_history_becomes_current_balances(Backend::SQLITE_FS).await
}

#[tokio::test]
async fn balance_history_becomes_current_balances_postgres() -> anyhow::Result<()> {
    balance_history_becomes_current_balances(Backend::POSTGRES_FS).await
}

/// Held bytes over 2 KiB move out of their rows into `held_apart`, smaller ones stay, each
/// row's `held` flag set exactly where it held some; bytes kept apart go with their row, and
/// none can be kept for a node without one.
async fn large_held_bytes_move_beside_their_rows(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let db = empty_database(&env, b).await?;
    apply(&db, dialect(b), |f| f < "0010").await?;
    let h = |i: u8| vec![i; 32];
    sqlx::query("INSERT INTO apps (app_id, issuer, revision, created_at) VALUES ('a', 'i', 0, 0)")
        .execute(&db)
        .await?;
    // Node 1 holds a few bytes, node 2 has an object, node 3 (another Space) and node 4 hold
    // more than 2 KiB, node 5 exactly 2 KiB.
    for (space, i, held) in [
        ("s", 1u8, Some(b"first".to_vec())),
        ("s", 2, None),
        ("t", 3, Some(vec![3u8; 70_000])),
        ("s", 4, Some(vec![4u8; 2049])),
        ("s", 5, Some(vec![5u8; 2048])),
    ] {
        sqlx::query(
            "INSERT INTO nodes (app_id, space_id, hash, size, content_type, ref_count, \
             object_gen, encoding, stored_bytes, lease_started_at, lease_expires_at, \
             created_at, held_bytes) VALUES ('a', $1, $2, 1, 'raw', 0, 'g', 'identity', 1, \
             0, 0, 0, $3)",
        )
        .bind(space)
        .bind(h(i))
        .bind(held)
        .execute(&db)
        .await?;
    }
    apply(&db, dialect(b), |f| f.starts_with("0010")).await?;
    let held: BTreeSet<(String, Vec<u8>, Vec<u8>)> =
        sqlx::query_as("SELECT space_id, hash, bytes FROM held_apart")
            .fetch_all(&db)
            .await?
            .into_iter()
            .collect();
    assert_eq!(
        held,
        BTreeSet::from([
            ("t".to_string(), h(3), vec![3u8; 70_000]),
            ("s".to_string(), h(4), vec![4u8; 2049]),
        ])
    );
    let rows: BTreeSet<(Vec<u8>, i64, Option<Vec<u8>>)> =
        sqlx::query_as("SELECT hash, CAST(held AS BIGINT), held_bytes FROM nodes")
            .fetch_all(&db)
            .await?
            .into_iter()
            .collect();
    assert_eq!(
        rows,
        BTreeSet::from([
            (h(1), 1, Some(b"first".to_vec())),
            (h(2), 0, None),
            (h(3), 1, None),
            (h(4), 1, None),
            (h(5), 1, Some(vec![5u8; 2048])),
        ])
    );
    // A row that is deleted takes the bytes it kept apart along.
    sqlx::query("DELETE FROM nodes WHERE space_id = 's' AND hash = $1")
        .bind(h(4))
        .execute(&db)
        .await?;
    let left: Vec<Vec<u8>> = sqlx::query_scalar("SELECT hash FROM held_apart")
        .fetch_all(&db)
        .await?;
    assert_eq!(left, vec![h(3)]);
    // Bytes of no node are refused.
    let orphan = sqlx::query(
        "INSERT INTO held_apart (app_id, space_id, hash, bytes) VALUES ('a', 's', $1, $2)",
    )
    .bind(h(9))
    .bind(b"nobody".to_vec())
    .execute(&db)
    .await;
    assert!(
        orphan.is_err(),
        "bytes kept apart without a row are refused"
    );
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn large_held_bytes_move_beside_their_rows_sqlite() -> anyhow::Result<()> {
    large_held_bytes_move_beside_their_rows(Backend::SQLITE_FS).await
}

#[tokio::test]
async fn large_held_bytes_move_beside_their_rows_postgres() -> anyhow::Result<()> {
    large_held_bytes_move_beside_their_rows(Backend::POSTGRES_FS).await
}
