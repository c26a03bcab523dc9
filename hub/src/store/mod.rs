//! The hub's database (SQLite or Postgres): mutable pointers and indexes only, see
//! `migrations/hub-*`; everything immutable is a node in the CAS. **This module is the only one
//! of the hub that speaks SQL**: the rest of the hub calls its functions and gets typed rows.

use anyhow::Context;
use sqlx::AnyPool;

use server_kit::sql::placeholders;
pub use server_kit::sql::{Dialect, WriteTx};
use server_kit::sql::{PoolOptions, SqlPool};

use crate::config::HubConfig;

/// An enum stored as a text column: `as_str` and `parse` in the column's words, which are also
/// its JSON and OpenAPI spelling, and `ALL` for tests.
macro_rules! column_enum {
    ($(#[$doc:meta])* pub enum $name:ident {
        $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)?
    }) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash,
            serde::Serialize, serde::Deserialize, utoipa::ToSchema,
        )]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            pub fn parse(s: &str) -> Option<$name> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl $crate::store::ColumnEnum for $name {
            fn from_column(s: &str) -> Option<Self> {
                $name::parse(s)
            }
        }
    };
}

pub mod app_pools;
pub mod catalog;
pub mod events;
pub mod idempotency;
pub mod invitations;
pub mod locks;
pub mod notebooks;
pub mod outbox;
pub mod sessions;
pub mod stats;
pub mod users;
pub mod versions;
pub mod web;

pub use catalog::SnapshotRow;
pub use events::{EventFilter, EventRow};
pub use idempotency::IdempotencyRow;
pub use invitations::{GrantedRole, InvitationRow};
pub use notebooks::{NotebookRow, NotebookState, TrashRow};
pub use users::{Identity, ScopeProjects, TokenRow, TokenScope, User};
pub use versions::{StoredVersion, VersionKind, VersionRow, VersionState};

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/hub-sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/hub-postgres");

/// The hub's database.
#[derive(Clone, Debug)]
pub struct HubStore {
    sql: SqlPool,
}

impl HubStore {
    /// Connects to the hub's database (creating the SQLite file if needed). Does not migrate.
    pub async fn connect(config: &HubConfig) -> anyhow::Result<HubStore> {
        let url = config.database_url()?;
        let dialect = Dialect::of_url(&url)?;
        let sql = SqlPool::connect(PoolOptions {
            url,
            max_connections: if dialect == Dialect::Sqlite { 8 } else { 16 },
            sqlite_full_sync: true,
            create_dir: Some(config.data_dir.clone()),
        })
        .await
        .context("the hub database")?;
        Ok(HubStore { sql })
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        self.sql
            .migrate(&SQLITE_MIGRATIONS, &POSTGRES_MIGRATIONS)
            .await
            .context(
                "hub database migration failed (is UNICAS_HUB_DATABASE_URL a database of its own?)",
            )
    }

    pub fn dialect(&self) -> Dialect {
        self.sql.dialect()
    }

    /// The URL it was opened with (for the lock pool; never print it unredacted).
    pub fn url(&self) -> &str {
        self.sql.url()
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> bool {
        self.sql.ping().await
    }

    /// A write transaction (one writer at a time on SQLite).
    pub async fn write(&self) -> Result<WriteTx, sqlx::Error> {
        self.sql.write().await
    }

    pub async fn close(&self) {
        self.sql.close().await;
    }

    fn pool(&self) -> &AnyPool {
        self.sql.pool()
    }
}

/// A column that does not hold what its type says.
fn decode_err(col: &str, value: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: col.to_string(),
        source: format!("unexpected value {value}").into(),
    }
}

/// What [`column_enum!`] implements: reading the enum back from its column.
pub trait ColumnEnum: Sized {
    fn from_column(s: &str) -> Option<Self>;
}

/// Reads a text column as one of the [`column_enum!`] enums.
fn enum_col<T: ColumnEnum>(row: &sqlx::any::AnyRow, col: &str) -> Result<T, sqlx::Error> {
    use sqlx::Row;
    let s: String = row.try_get(col)?;
    T::from_column(&s).ok_or_else(|| decode_err(col, format!("{s:?}")))
}

/// Reads a text column as one of our parsed types (ids, hashes).
fn parsed<T: std::str::FromStr>(row: &sqlx::any::AnyRow, col: &str) -> Result<T, sqlx::Error>
where
    T::Err: std::fmt::Display,
{
    use sqlx::Row;
    let s: String = row.try_get(col)?;
    s.parse().map_err(|e: T::Err| decode_err(col, e))
}

/// Reads a nullable text column as one of our parsed types.
fn parsed_opt<T: std::str::FromStr>(
    row: &sqlx::any::AnyRow,
    col: &str,
) -> Result<Option<T>, sqlx::Error>
where
    T::Err: std::fmt::Display,
{
    use sqlx::Row;
    let s: Option<String> = row.try_get(col)?;
    s.map(|s| s.parse().map_err(|e: T::Err| decode_err(col, e)))
        .transpose()
}
