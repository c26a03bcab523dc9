//! Named failpoints for crash and fault tests. They exist only in builds with the `failpoints`
//! feature and act only when `UNICAS_FAILPOINTS` names them, as `name=action[,name=action]`:
//!
//! - `pause`: log `failpoint <name> reached` and wait forever (a test then kills the process);
//! - `abort`: end the process on the spot;
//! - `error`: make the step fail as if its store had failed;
//! - `delay:MS`: wait MS milliseconds, then go on (a test widens a race window).

/// Whether the failpoint `name` asks the caller to fail. Without the feature: never.
#[cfg(feature = "failpoints")]
pub async fn hit(name: &str) -> bool {
    let Ok(spec) = std::env::var("UNICAS_FAILPOINTS") else {
        return false;
    };
    let action = spec
        .split(',')
        .filter_map(|item| item.split_once('='))
        .find(|(n, _)| n.trim() == name)
        .map(|(_, a)| a.trim().to_string());
    match action.as_deref() {
        Some("pause") => {
            tracing::warn!("failpoint {name} reached");
            std::future::pending::<()>().await;
            false
        }
        Some("abort") => {
            tracing::warn!("failpoint {name} reached; aborting");
            std::process::abort()
        }
        Some("error") => true,
        Some(a) => {
            if let Some(ms) = a.strip_prefix("delay:").and_then(|ms| ms.parse().ok()) {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            false
        }
        None => false,
    }
}

/// Whether the failpoint `name` asks the caller to fail. Without the feature: never.
#[cfg(not(feature = "failpoints"))]
pub async fn hit(_name: &str) -> bool {
    false
}
