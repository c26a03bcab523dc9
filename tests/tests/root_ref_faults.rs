//! Root-ref updates that share batches while the database fails under them: a statement the
//! database refuses, and connections cut at any moment (inside a batch, at its commit). Every
//! update answered 2xx is applied once, at the revision it was answered; every update refused
//! because of the fault is either absent or (a commit whose answer was lost) replayed with its
//! revision when sent again; revisions stay consecutive, the balances are the sum of the
//! events, the invariants hold, and the partition keeps serving.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cas_client::{AppCasClient, ClientError};
use cas_format::{Hash, RequestId, SpaceId};
use tests::partition::{NODES, Partition, checked_log};
use tests::*;

/// Concurrent clients, each sending its updates one after another.
const WORKERS: usize = 12;
/// Updates each client sends.
const EACH: usize = 24;

/// What update `k` of client `w` changes.
fn changes_of(nodes: &[Hash], w: usize, k: usize) -> BTreeMap<Hash, i64> {
    let i = w * 31 + k;
    BTreeMap::from([(nodes[i % NODES], 1), (nodes[(i + 3) % NODES], 2)])
}

/// The request id of update `k` of client `w`; every sixth is one the database refuses while
/// the test's trigger is installed.
fn id_of(w: usize, k: usize, poisoned: bool) -> String {
    if poisoned && (w + k).is_multiple_of(6) {
        format!("poison-{w}-{k}")
    } else {
        format!("w{w}-{k}")
    }
}

fn rid(id: &str) -> RequestId {
    id.parse().expect("a request id")
}

/// The request id and changes of update `k` of client `w`.
fn update_of(nodes: &[Hash], w: usize, k: usize, poisoned: bool) -> (String, BTreeMap<Hash, i64>) {
    (id_of(w, k, poisoned), changes_of(nodes, w, k))
}

/// Checks the partition's log (see [`checked_log`]) against what was sent and answered: it
/// starts at revision 1, holds each update sent once and whole, and each answered revision is
/// its update's.
async fn check_log(
    env: &TestEnv,
    client: &AppCasClient,
    sp: &SpaceId,
    sent: &BTreeMap<String, BTreeMap<Hash, i64>>,
    answered: &BTreeMap<String, u64>,
) -> anyhow::Result<()> {
    let log = checked_log(env, client, sp).await?;
    assert_eq!(log.first().map(|a| a.revision), Some(1));
    let mut seen = BTreeMap::new();
    for a in &log {
        assert_eq!(
            Some(&a.changes),
            sent.get(&a.request_id),
            "event {} ({}) is an update as sent",
            a.revision,
            a.request_id
        );
        assert!(
            seen.insert(a.request_id.clone(), a.revision).is_none(),
            "{} applied twice",
            a.request_id
        );
    }
    for (id, revision) in answered {
        assert_eq!(
            seen.get(id),
            Some(&(*revision as i64)),
            "{id} is applied at the revision it was answered"
        );
    }
    assert_eq!(seen.len(), sent.len(), "every update is applied once");
    Ok(())
}

/// The database refuses some updates' statements (a trigger on the event log, as a database
/// that fails would): each such update is refused, and so are the updates applied in the same
/// statement or (on Postgres, where a batch planned from the partition's memo has no savepoint
/// per operation) the same batch: none of them is applied, the others are, and once the fault
/// is gone every refused update is applied when sent again, as new.
async fn a_refused_statement_fails_its_batch_and_nothing_else(b: Backend) -> anyhow::Result<()> {
    let Partition {
        env,
        server: _server,
        client,
        sp,
        nodes,
    } = Partition::new(b).await?;
    let db = env.database().await?;
    let trigger = match b.db {
        Db::Postgres => vec![
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON root_ref_events FOR EACH ROW \
             WHEN (NEW.request_id LIKE 'poison%') EXECUTE FUNCTION refuse_poison()",
        ],
        Db::Sqlite => vec![
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON root_ref_events \
             WHEN NEW.request_id LIKE 'poison%' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        ],
    };
    for statement in trigger {
        sqlx::raw_sql(statement).execute(&db).await?;
    }

    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (client, sp, nodes) = (client.clone(), sp.clone(), nodes.clone());
        workers.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for k in 0..EACH {
                let (id, changes) = update_of(&nodes, w, k, true);
                let answer = client.update_root_refs(&sp, &rid(&id), changes).await;
                answers.push((id, answer));
            }
            answers
        }));
    }
    let mut answered = BTreeMap::new();
    let mut refused = Vec::new();
    for worker in workers {
        for (id, answer) in worker.await? {
            match answer {
                Ok(r) => {
                    assert!(!id.starts_with("poison"), "{id} was applied: {r:?}");
                    assert!(r.success && !r.idempotent, "{id}: {r:?}");
                    answered.insert(id, r.revision);
                }
                Err(e @ ClientError::Api { .. }) => {
                    assert!(
                        matches!(e.status(), Some(500 | 503)),
                        "{id}: a database failure is answered as one: {e}"
                    );
                    refused.push(id);
                }
                Err(e) => panic!("{id}: {e}"),
            }
        }
    }
    let poisoned = refused.iter().filter(|id| id.starts_with("poison")).count();
    assert_eq!(
        poisoned,
        (0..WORKERS)
            .flat_map(|w| (0..EACH).map(move |k| id_of(w, k, true)))
            .filter(|id| id.starts_with("poison"))
            .count()
    );
    assert!(
        refused.len() > poisoned,
        "some updates shared a refused statement's batch ({} refused)",
        refused.len()
    );
    assert!(!answered.is_empty(), "the others were applied");

    // The fault gone, every refused update is new to the partition: none of it was applied.
    let drop = match b.db {
        Db::Postgres => "DROP TRIGGER refuse_poison ON root_ref_events",
        Db::Sqlite => "DROP TRIGGER refuse_poison",
    };
    sqlx::raw_sql(drop).execute(&db).await?;
    let mut sent = BTreeMap::new();
    for w in 0..WORKERS {
        for k in 0..EACH {
            let (id, changes) = update_of(&nodes, w, k, true);
            sent.insert(id, changes);
        }
    }
    for id in &refused {
        let r = client
            .update_root_refs(&sp, &rid(id), sent[id].clone())
            .await?;
        assert!(!r.idempotent, "{id} was refused yet applied");
        answered.insert(id.clone(), r.revision);
    }
    check_log(&env, &client, &sp, &sent, &answered).await
}

/// What the clients of [`until_stopped`] sent and were answered.
#[derive(Default)]
struct Sent {
    /// Request id → changes, of every update sent.
    updates: BTreeMap<String, BTreeMap<Hash, i64>>,
    /// Request id → the revision of its 2xx answer.
    answered: BTreeMap<String, u64>,
    /// Updates whose 2xx answer was a replay (an earlier attempt had been applied).
    replays: usize,
    /// Every failed attempt: request id, status, error.
    failures: Vec<(String, Option<u16>, String)>,
}

/// [`WORKERS`] clients sending updates until `until` is done, each update sent again (the same request
/// id and changes) until it is answered 2xx, as a client should.
async fn until_stopped(
    client: &AppCasClient,
    sp: &SpaceId,
    nodes: &[Hash],
    until: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<Sent> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (client, sp, nodes, stop) = (client.clone(), sp.clone(), nodes.to_vec(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut sent = Sent::default();
            for k in 0.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let (id, changes) = update_of(&nodes, w, k, false);
                sent.updates.insert(id.clone(), changes.clone());
                for attempt in 1.. {
                    match client
                        .update_root_refs(&sp, &rid(&id), changes.clone())
                        .await
                    {
                        Ok(r) => {
                            assert!(r.success);
                            sent.replays += usize::from(r.idempotent);
                            sent.answered.insert(id, r.revision);
                            break;
                        }
                        Err(e) if attempt < 50 => {
                            sent.failures.push((id.clone(), e.status(), e.to_string()));
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => anyhow::bail!("{id} failed {attempt} times, lastly: {e}"),
                    }
                }
            }
            anyhow::Ok(sent)
        }));
    }
    let waited = until.await;
    stop.store(true, Ordering::SeqCst);
    let mut all = Sent::default();
    for worker in workers {
        let sent = worker.await??;
        all.updates.extend(sent.updates);
        all.answered.extend(sent.answered);
        all.replays += sent.replays;
        all.failures.extend(sent.failures);
    }
    waited?;
    assert!(!all.failures.is_empty(), "the faults failed some updates");
    for (id, status, e) in &all.failures {
        assert_eq!(
            *status,
            Some(503),
            "{id}: a lost connection is retryable: {e}"
        );
    }
    Ok(all)
}

/// Connections to Postgres cut again and again (every connection of the test's database
/// terminated, 15 ms apart, at least 40 times and until a batch's commit has failed) while 12
/// clients send root-ref updates that share batches: statements, begins and commits fail for
/// real. Each client sends each update until it is answered 2xx: every failure on the way is
/// answered 503, retryable, and every update ends applied exactly once, at the revision its
/// last answer names.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cut_connections_lose_no_update_and_apply_none_twice() -> anyhow::Result<()> {
    let Partition {
        env,
        server,
        client,
        sp,
        nodes,
    } = Partition::new(Backend::POSTGRES_FS).await?;
    let killer = env.database().await?;
    let cutting = async {
        let (started, mut rounds) = (Instant::now(), 0);
        loop {
            tokio::time::sleep(Duration::from_millis(15)).await;
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .execute(&killer)
            .await?;
            rounds += 1;
            if rounds >= 40 && server.metric("unicas_commit_failures_total").await? >= 1.0 {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "no batch commit failed in {rounds} rounds of cut connections"
            );
        }
    };
    let sent = until_stopped(&client, &sp, &nodes, cutting).await?;
    killer.close().await;
    check_log(&env, &client, &sp, &sent.updates, &sent.answered).await
}

/// Commits whose answers are lost (a proxy between the service and Postgres passes every
/// fourth `COMMIT` on and closes the connection when the database answers it, at least 10
/// times) while 12 clients send root-ref updates: the service answers 503 for a batch it
/// cannot know to be committed, and its updates, sent again, are answered as replays of the
/// revisions they were applied at; no update is lost or applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commits_whose_answers_are_lost_are_replayed() -> anyhow::Result<()> {
    let env = TestEnv::new(Backend::POSTGRES_FS).await?;
    let app = env.create_app("hub")?;
    let database = reqwest::Url::parse(&env.vars["UNICAS_DATABASE_URL"])?;
    let upstream = format!(
        "{}:{}",
        database.host_str().unwrap_or("127.0.0.1"),
        database.port().unwrap_or(5432)
    );
    let proxy = tests::pg_proxy::PgProxy::start(&upstream).await?;
    let server = env.start_with(&[("UNICAS_DATABASE_URL", &proxy.url_for(database.as_str())?)])?;
    let Partition {
        env,
        server: _server,
        client,
        sp,
        nodes,
    } = Partition::on(env, &app, server).await?;
    proxy.lose_every(4);
    let losing = async {
        let started = Instant::now();
        while proxy.lost() < 10 {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "only {} commits lost their answers",
                proxy.lost()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    };
    let sent = until_stopped(&client, &sp, &nodes, losing).await?;
    proxy.lose_every(0);
    assert!(
        sent.replays > 0,
        "some updates of a commit whose answer was lost were replayed"
    );
    check_log(&env, &client, &sp, &sent.updates, &sent.answered).await
}

e2e!(a_refused_statement_fails_its_batch_and_nothing_else);
