//! One partition to drive root-ref updates at: a server with Space `s` of App `hub` holding
//! [`NODES`] stored nodes, and a client that does not retry (so that every answer the service
//! gives is seen).

use std::collections::BTreeMap;
use std::time::Duration;

use cas_client::{AppCasClient, RetryPolicy};
use cas_format::{Hash, SpaceId};
use cas_service::meta::RefFilter;

use crate::{Backend, Server, TestApp, TestEnv, leaf, space};

/// How many nodes the partition holds.
pub const NODES: usize = 8;

/// A server with Space `s` of App `hub` holding [`NODES`] nodes, and a client that does not
/// retry.
pub struct Partition {
    pub env: TestEnv,
    pub server: Server,
    pub client: AppCasClient,
    pub sp: SpaceId,
    pub nodes: Vec<Hash>,
}

impl Partition {
    pub async fn new(b: Backend) -> anyhow::Result<Self> {
        let env = TestEnv::new(b).await?;
        let app = env.create_app("hub")?;
        let server = env.start()?;
        Partition::on(env, &app, server).await
    }

    /// The partition of App `app` (named `hub`) on `server`, started on `env` by the caller.
    pub async fn on(env: TestEnv, app: &TestApp, server: Server) -> anyhow::Result<Self> {
        let client = app.client(&server).with_retry(RetryPolicy {
            attempts: 1,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        });
        let sp = space("s");
        let mut nodes = Vec::new();
        for i in 0..NODES as u32 {
            let (h, bytes) = leaf(&i.to_le_bytes());
            client.ensure_node(&sp, &h, &bytes, 600_000).await?;
            nodes.push(h);
        }
        Ok(Partition {
            env,
            server,
            client,
            sp,
            nodes,
        })
    }
}

/// Every balance or event of Space `sp`, in every domain.
pub fn all_of(sp: &SpaceId) -> RefFilter<'_> {
    RefFilter {
        space: Some(sp),
        domain: None,
        hash: None,
    }
}

/// One applied update, as the partition's event log holds it.
pub struct Applied {
    pub revision: i64,
    pub request_id: String,
    pub changes: BTreeMap<Hash, i64>,
}

/// Space `sp`'s event log (App `hub`), checked against the rest of the database: its
/// revisions are consecutive, the balances listed are the sum of its changes, and the
/// invariants hold.
pub async fn checked_log(
    env: &TestEnv,
    client: &AppCasClient,
    sp: &SpaceId,
) -> anyhow::Result<Vec<Applied>> {
    let meta = env.meta().await?;
    let app_id = "hub".parse()?;
    let mut log = Vec::new();
    let mut sums: BTreeMap<Hash, i64> = BTreeMap::new();
    for e in meta
        .events(&app_id, all_of(sp), 0, i64::MAX, 10_000)
        .await?
    {
        let changes: BTreeMap<Hash, i64> = serde_json::from_str(&e.changes)?;
        for (h, d) in &changes {
            *sums.entry(*h).or_default() += d;
        }
        log.push(Applied {
            revision: e.revision,
            request_id: e.request_id,
            changes,
        });
    }
    let revisions: Vec<i64> = log.iter().map(|a| a.revision).collect();
    if let Some(first) = revisions.first() {
        let consecutive: Vec<i64> = (*first..first + revisions.len() as i64).collect();
        anyhow::ensure!(revisions == consecutive, "revisions {revisions:?}");
    }
    let page = client.list_root_refs(sp, 100, None).await?;
    let listed: BTreeMap<Hash, i64> = page.items.iter().map(|i| (i.hash, i.ref_count)).collect();
    anyhow::ensure!(
        listed == sums,
        "the balances {listed:?} are not the sum of the events {sums:?}"
    );
    env.check_invariants(&meta, &app_id).await?;
    Ok(log)
}
