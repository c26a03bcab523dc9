//! One partition to drive root-ref updates at: a server with Space `s` of App `hub` holding
//! [`NODES`] stored nodes, and a client that does not retry (so that every answer the service
//! gives is seen).

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
