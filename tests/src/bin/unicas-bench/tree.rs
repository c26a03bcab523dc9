//! The tree benchmark: `unicas tree put` and get beside a durable copy of the same tree.

use std::time::Instant;

use anyhow::Context;
use tests::{Backend, TestEnv, space};

use crate::cpu::CpuMark;
use crate::name;

/// The trees of the tree benchmark.
#[derive(Debug, Clone, Copy)]
pub enum TreeShape {
    /// 264 notebook-sized files (8–280 KiB), about 38 MB, in a few directories.
    Notebooks,
    /// 2,000 small files (1–64 KiB), 40 medium (1–4 MiB), 4 large (32 MiB): about 300 MB.
    Mixed,
}

/// Durable copies of the tree timed before the puts; the fastest is the baseline.
const COPIES: usize = 3;
/// Cold puts of the tree, each into a Space of its own that holds nothing yet: the first one
/// is also the server's first work; the fastest is set against the fastest copy.
const PUTS: usize = 3;

/// Tree put and get of a tree, beside a durable copy (`cp -r` then `sync`, the fastest of
/// [`COPIES`]) of the same tree in the same run; the source is synced before anything is timed.
/// The put is timed [`PUTS`] times, each into a new Space (nothing of the tree stored there, so
/// every node is uploaded, validated and written again), and each put's line is followed by
/// the CPU it cost the server and the client (this process, which plans and uploads), and how
/// busy the machine was: on few cores the two share them. Copies and puts alike swing with
/// what the machine is doing; their fastest are set against each other, and every put is shown.
pub async fn tree_bench(b: Backend, shape: TreeShape) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("bench")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("tree");
    let src = env.dir.path().join("src");
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let mut total = 0u64;
    let mut files = 0u64;
    let mut write = |path: std::path::PathBuf, len: usize| -> anyhow::Result<()> {
        let mut data = vec![0u8; len];
        rand::RngCore::fill_bytes(&mut rng, &mut data);
        std::fs::create_dir_all(path.parent().context("parent")?)?;
        std::fs::write(path, &data)?;
        total += len as u64;
        files += 1;
        Ok(())
    };
    match shape {
        TreeShape::Notebooks => {
            for i in 0..264usize {
                write(
                    src.join(format!("p{}/nb{i}.py", i % 12)),
                    8 * 1024 + (i * 104_729) % (272 * 1024),
                )?;
            }
        }
        TreeShape::Mixed => {
            for i in 0..2000usize {
                write(
                    src.join(format!("d{}/e{}/f{i}.txt", i % 20, i % 7)),
                    1024 + (i * 7919) % (63 * 1024),
                )?;
            }
            for i in 0..40usize {
                write(
                    src.join(format!("medium/m{i}.bin")),
                    (1 << 20) + (i * 77_777) % (3 << 20),
                )?;
            }
            for i in 0..4usize {
                write(src.join(format!("large/l{i}.bin")), 32 << 20)?;
            }
        }
    }
    anyhow::ensure!(std::process::Command::new("sync").status()?.success());
    // The fastest of three copies: the copy's time swings with what the disk is doing, and
    // the ratios are meant against what the disk can do.
    let mut cp = f64::INFINITY;
    for k in 0..COPIES {
        let t = Instant::now();
        anyhow::ensure!(
            std::process::Command::new("cp")
                .arg("-r")
                .arg(&src)
                .arg(env.dir.path().join(format!("copy{k}")))
                .status()?
                .success()
        );
        anyhow::ensure!(std::process::Command::new("sync").status()?.success());
        cp = cp.min(t.elapsed().as_secs_f64());
    }
    let mut puts = Vec::new();
    for k in 0..PUTS {
        let into = if k == 0 {
            sp.clone()
        } else {
            space(&format!("tree-{k}"))
        };
        let cpu = CpuMark::take(server.pid())?;
        let t = Instant::now();
        let (root, report, _) = client.store_tree(&into, &src, 900_000, 8, None).await?;
        let s = t.elapsed().as_secs_f64();
        let cpu = CpuMark::take(server.pid())?.since(&cpu, 1.0 / s, "the put", "client");
        anyhow::ensure!(
            report.uploaded_nodes == report.nodes,
            "put {k} found nodes stored"
        );
        puts.push((root, report, s, cpu));
    }
    let (root, report) = (puts[0].0, puts[0].1);
    anyhow::ensure!(puts.iter().all(|p| p.0 == root));
    let t = Instant::now();
    let (again, second, _) = client.store_tree(&sp, &src, 900_000, 8, None).await?;
    let put_again = t.elapsed().as_secs_f64();
    anyhow::ensure!(again == root && second.uploaded_bytes == 0);
    let t = Instant::now();
    client
        .materialize_tree(&sp, &root, &env.dir.path().join("got"), 8, None)
        .await?;
    let get = t.elapsed().as_secs_f64();
    let mb = total as f64 / 1e6;
    println!(
        "\ntree of {files} files, {mb:.0} MB, {} nodes ({})",
        report.nodes,
        name(b)
    );
    println!(
        "  {:<44} {:>8.2} s  {:>7.0} MB/s",
        format!("baseline: cp -r, then sync (fastest of {COPIES})"),
        cp,
        mb / cp
    );
    let line = |what: &str, s: f64| {
        println!(
            "  {what:<44} {s:>8.2} s  {:>7.0} MB/s  {:.2}x the durable copy",
            mb / s,
            s / cp
        );
    };
    for (k, (_, _, s, cpu)) in puts.iter().enumerate() {
        let first = if k == 0 { "; server's first" } else { "" };
        line(
            &format!("tree put {} of {PUTS} (new Space{first})", k + 1),
            *s,
        );
        println!("    {cpu}");
    }
    let fastest = puts.iter().map(|p| p.2).fold(f64::INFINITY, f64::min);
    line(&format!("tree put (fastest of {PUTS})"), fastest);
    line("tree put again (nothing uploaded)", put_again);
    line("tree get", get);
    Ok(())
}
