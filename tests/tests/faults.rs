//! Faults between the service and S3: a proxy errors, loses answers and delays a fraction of
//! requests. The service answers 503 or retries, never publishes a row without its object, and
//! fsck is clean once the faults stop.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use cas_client::{ClientError, RetryPolicy};
use cas_format::Hash;
use tests::fault_proxy::{FaultProxy, Faults};
use tests::*;

async fn s3_faults(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let upstream = std::env::var("UNICAS_S3_ENDPOINT")?;
    let proxy = FaultProxy::start(&upstream).await?;
    let server = env.start_with(&[("UNICAS_S3_ENDPOINT", &proxy.url)])?;
    // The client gives up quickly so that service errors surface instead of being retried away.
    let client = app.client(&server).with_retry(RetryPolicy {
        attempts: 2,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    });
    let sp = space("s");
    proxy
        .set(Faults {
            error: 0.15,
            lost_answer: 0.15,
            delay: 0.2,
            max_delay: Duration::from_millis(300),
        })
        .await;
    let mut ready: Vec<Hash> = Vec::new();
    let mut refused = 0;
    for i in 0..30u32 {
        // Large enough to go straight to S3 (presigned), and small ones through the service.
        let size = if i % 2 == 0 { 2 << 20 } else { 300 };
        let content: Vec<u8> = (0..size)
            .map(|k| (k as u32).wrapping_mul(i + 7) as u8)
            .collect();
        let (child, child_b) = leaf(&content);
        let (p, p_b) = node("application/x-test", &[child], &i.to_le_bytes());
        let nodes: HashMap<Hash, Bytes> = [(child, child_b), (p, p_b)].into_iter().collect();
        match client.store_dag(&sp, &nodes, &[p], 60_000, 2).await {
            Ok(_) => ready.push(p),
            // The service says 503; the object store itself (presigned PUTs go to it directly,
            // through the proxy) answers with its own non-JSON errors.
            Err(ClientError::Api { status: 503, .. }) | Err(ClientError::Transport(_)) => {
                refused += 1
            }
            Err(ClientError::Api { code, .. }) if code.starts_with("HTTP_5") => refused += 1,
            Err(e) => anyhow::bail!("only 503 may come of a store fault, got {e}"),
        }
        if i % 10 == 9 {
            match client.gc(&sp, None).await {
                Ok(_) | Err(ClientError::Api { status: 503, .. }) => {}
                Err(e) => anyhow::bail!("gc under faults: {e}"),
            }
        }
    }
    let counts = proxy.counts();
    eprintln!(
        "s3_faults: {} stored, {refused} refused; proxy: {} forwarded, {} errors, {} lost answers, {} delayed",
        ready.len(),
        counts.forwarded.load(std::sync::atomic::Ordering::Relaxed),
        counts.errors.load(std::sync::atomic::Ordering::Relaxed),
        counts.lost.load(std::sync::atomic::Ordering::Relaxed),
        counts.delayed.load(std::sync::atomic::Ordering::Relaxed),
    );
    assert!(counts.errors.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert!(counts.lost.load(std::sync::atomic::Ordering::Relaxed) > 0);
    // Faults stop: everything reported ready reads back, and the store is consistent.
    proxy.set(Faults::default()).await;
    let client = app.client(&server);
    for p in &ready {
        let meta = client.read_metadata(&sp, p).await?;
        client.read_node(&sp, &meta.metadata.refs[0]).await?;
    }
    client
        .update_root_refs(
            &sp,
            &"keep".parse()?,
            ready.iter().map(|h| (*h, 1)).collect::<BTreeMap<_, _>>(),
        )
        .await?;
    env.check_invariants(&env.meta().await?, &app.app).await?;
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(ok, "{report:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_faults_sqlite() -> anyhow::Result<()> {
    s3_faults(Backend::SQLITE_S3).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_faults_postgres() -> anyhow::Result<()> {
    s3_faults(Backend::POSTGRES_S3).await
}
