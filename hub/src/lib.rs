//! The notebook hub: catalog, projects, notebooks, versions and workspaces, stored as UniCAS nodes through `cas-client` and retained by root refs.
