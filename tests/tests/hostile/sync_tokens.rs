//! Class 6: a sync token acts for its owner as the owner stands now. Removed from the project,
//! demoted below editor or suspended, and pushes with it stop; a manager who rotates the token
//! becomes the one it acts for.

use serde_json::json;
use tests::Backend;
use tests::hub::{HubEnv, data, refused, tar_of};
use tests::hub_e2e;

use crate::support::{push, push_notebook, revisions};

hub_e2e!(a_sync_token_follows_its_owner);

async fn a_sync_token_follows_its_owner(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let alice_token = env.user("alice")?;
    let bob_token = env.user("bob")?;
    let server = env.start()?;
    let a = server.client(Some(&alice_token));
    let bob = server.client(Some(&bob_token));
    let pid = a.project("P").await?;
    let members = format!("/api/v1/projects/{pid}/members");
    data(
        &a.put(&members, &json!({"user_id": "bob", "role": "manager"}))
            .await?,
        200,
    );
    let (nid, token) = push_notebook(&bob, &pid, "ci").await?;
    let body = |n: u8| tar_of(&[("app.py", &[b'0' + n])]);
    data(&push(&server.url, &token, body(1)).await?, 200);

    // Removed from the project: the token stops.
    data(&a.delete(&format!("{members}/bob")).await?, 200);
    refused(&push(&server.url, &token, body(2)).await?, 403, "FORBIDDEN");
    // Back as a viewer: still no.
    data(
        &a.put(&members, &json!({"user_id": "bob", "role": "viewer"}))
            .await?,
        200,
    );
    refused(&push(&server.url, &token, body(3)).await?, 403, "FORBIDDEN");
    // An editor again: it works.
    data(
        &a.put(&members, &json!({"user_id": "bob", "role": "editor"}))
            .await?,
        200,
    );
    data(&push(&server.url, &token, body(4)).await?, 200);
    // Suspended: no.
    env.cli(&["user", "suspend", "bob"])?;
    refused(&push(&server.url, &token, body(5)).await?, 403, "FORBIDDEN");
    assert_eq!(
        revisions(&a, &pid, &nid).await?,
        [2, 1],
        "a refused push stored a version"
    );

    // The owner (a manager) rotates it and becomes the one it acts for.
    let rotated = data(
        &a.post(
            &format!("/api/v1/projects/{pid}/notebooks/{nid}/sync-token"),
            &json!({}),
        )
        .await?,
        200,
    );
    let new_token = rotated["sync_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    refused(
        &push(&server.url, &token, body(6)).await?,
        401,
        "UNAUTHORIZED",
    );
    data(&push(&server.url, &new_token, body(7)).await?, 200);
    assert_eq!(revisions(&a, &pid, &nid).await?, [3, 2, 1]);
    Ok(())
}
