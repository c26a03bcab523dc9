//! Where a file's content is cut into chunks: deterministic, from the bytes alone (never the
//! name, so a renamed or copied file is the same node), byte-exact on reassembly.
//!
//! - A **marimo notebook** (a line that starts `app = marimo.App(`) is cut at the start of
//!   every line that starts a cell (`@app.cell`, `@app.function`, `@app.class_definition`), at
//!   the `app = marimo.App(` line and at `if __name__`: an edit of one cell changes one chunk,
//!   and the script header (with `__generated_with`) is a chunk of its own.
//! - A **Jupyter notebook** (a JSON object with a top-level `"cells"` array) is cut at the
//!   start of each cell object (at the start of its line when only blanks precede it), so the
//!   header, each cell with its outputs, and the trailing metadata are chunks.
//! - **Other text** (UTF-8 without NUL bytes) is cut by content-defined chunking sized for
//!   small files ([`TEXT_MIN`]..[`TEXT_MAX`], [`TEXT_AVG`] on average).
//! - A notebook segment larger than [`SEGMENT_MAX`] (a cell with a large output) is cut further
//!   by content-defined chunking ([`SEGMENT_MAX`] at most), so every chunk of a notebook can
//!   travel inline in a batch lease.
//!
//! Files of at most [`SPLIT_MIN`] bytes stay one leaf; binary files keep the layout of
//! [`crate::files`] (one leaf up to 1 MiB, 1 MiB content-defined chunks above), as does any
//! file larger than [`FORMAT_MAX`].

use crate::files::{CHUNK_AVG, CHUNK_MAX, CHUNK_MIN, CHUNKING_THRESHOLD};

/// Files up to this size stay one leaf: a chunk list would cost more than it saves.
pub const SPLIT_MIN: usize = 4 << 10;
/// Larger files are chunked by the streaming 1 MiB layout; up to this size a file is read
/// whole (no more than the largest chunk of that layout) to find its format's boundaries.
pub const FORMAT_MAX: usize = 4 << 20;
/// Content-defined chunking of text: bounds that keep an edit's cost to a few KiB while the
/// index stays under 1% of the content.
pub const TEXT_MIN: usize = 2 << 10;
pub const TEXT_AVG: usize = 8 << 10;
pub const TEXT_MAX: usize = 16 << 10;
/// Notebook segments above this are cut by content-defined chunking (this is also the largest
/// node that travels inline in a batch lease).
pub const SEGMENT_MAX: usize = 64 << 10;
const SEGMENT_MIN: usize = 16 << 10;
const SEGMENT_AVG: usize = 32 << 10;

/// The layout chosen for a piece of content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Marimo,
    Jupyter,
    Text,
    Binary,
}

/// What `content` is, from its bytes.
pub fn detect(content: &[u8]) -> Format {
    classify(content).0
}

/// What `content` is, with where its format's segments start (empty for text and binary):
/// one scan finds both.
fn classify(content: &[u8]) -> (Format, Vec<usize>) {
    if content.contains(&0) || std::str::from_utf8(content).is_err() {
        return (Format::Binary, Vec::new());
    }
    if lines(content).any(|(_, line)| line.starts_with(b"app = marimo.App(")) {
        return (Format::Marimo, marimo_cells(content));
    }
    let cells = jupyter_cells(content);
    if !cells.is_empty() {
        return (Format::Jupyter, cells);
    }
    (Format::Text, Vec::new())
}

/// The lengths of the chunks `content` is cut into, in order (they add up to its length); one
/// length when it stays whole.
pub fn chunk_lengths(content: &[u8]) -> Vec<usize> {
    if content.len() <= SPLIT_MIN {
        return vec![content.len()];
    }
    let starts = match classify(content) {
        (Format::Binary, _) if content.len() as u64 > CHUNKING_THRESHOLD => {
            return cdc(content, CHUNK_MIN, CHUNK_AVG, CHUNK_MAX);
        }
        (Format::Binary, _) => return vec![content.len()],
        (Format::Text, _) => return cdc(content, TEXT_MIN, TEXT_AVG, TEXT_MAX),
        (Format::Marimo | Format::Jupyter, starts) => starts,
    };
    let mut bounds: Vec<usize> = std::iter::once(0)
        .chain(starts.into_iter().filter(|&s| s > 0 && s < content.len()))
        .chain(std::iter::once(content.len()))
        .collect();
    bounds.dedup();
    let mut lengths = Vec::new();
    for w in bounds.windows(2) {
        let segment = &content[w[0]..w[1]];
        if segment.len() > SEGMENT_MAX {
            lengths.extend(cdc(segment, SEGMENT_MIN, SEGMENT_AVG, SEGMENT_MAX));
        } else {
            lengths.push(segment.len());
        }
    }
    lengths
}

fn cdc(content: &[u8], min: usize, avg: usize, max: usize) -> Vec<usize> {
    fastcdc::v2020::FastCDC::new(content, min, avg, max)
        .map(|c| c.length)
        .collect()
}

/// Each line with the offset it starts at (without its `\n`).
fn lines(content: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut at = 0;
    content.split(|&b| b == b'\n').map(move |line| {
        let start = at;
        at += line.len() + 1;
        (start, line)
    })
}

/// Where the marimo notebook's cells, app line and main guard start.
fn marimo_cells(content: &[u8]) -> Vec<usize> {
    const STARTS: [&[u8]; 5] = [
        b"@app.cell",
        b"@app.function",
        b"@app.class_definition",
        b"app = marimo.App(",
        b"if __name__",
    ];
    lines(content)
        .filter(|(_, line)| STARTS.iter().any(|s| line.starts_with(s)))
        .map(|(start, _)| start)
        .collect()
}

/// Where the cell objects of a Jupyter notebook's top-level `"cells"` array start; empty when
/// the content is not such a JSON object. A scan of the JSON text's structure (strings,
/// escapes, nesting), not a parse: it only chooses cut points.
fn jupyter_cells(content: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut string_start = 0;
    // The last string that ended at depth 1 was the key "cells".
    let mut cells_key = false;
    // Depth of the inside of the "cells" array while the scan is in it.
    let mut in_cells: Option<usize> = None;
    let first = content.iter().position(|b| !b.is_ascii_whitespace());
    if first.map(|i| content[i]) != Some(b'{') {
        return starts;
    }
    for (i, &b) in content.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if depth == 1 {
                    cells_key = &content[string_start..i] == b"cells";
                }
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                string_start = i + 1;
            }
            b'{' | b'[' => {
                if b == b'[' && depth == 1 && cells_key {
                    in_cells = Some(2);
                }
                if b == b'{' && in_cells == Some(depth) {
                    let line_start = content[..i]
                        .iter()
                        .rposition(|&c| c == b'\n')
                        .map_or(0, |n| n + 1);
                    let blank = content[line_start..i]
                        .iter()
                        .all(|c| *c == b' ' || *c == b'\t');
                    starts.push(if blank { line_start } else { i });
                }
                if depth == 1 {
                    cells_key = false;
                }
                depth += 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if b == b']' && in_cells == Some(depth + 1) {
                    in_cells = None;
                }
                if depth == 0 {
                    // The top-level object ended: what follows is not part of it.
                    break;
                }
            }
            // A key's colon and blanks keep what the last key was.
            b':' => {}
            c if c.is_ascii_whitespace() => {}
            _ => {
                if depth == 1 {
                    cells_key = false;
                }
            }
        }
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marimo(cells: &[&str]) -> String {
        let mut s = String::from(
            "# /// script\n# dependencies = [\"marimo\"]\n# ///\n\nimport marimo\n\n\
             __generated_with = \"0.20.4\"\napp = marimo.App(width=\"medium\")\n\n\n",
        );
        for c in cells {
            s.push_str(&format!(
                "@app.cell(hide_code=True)\ndef _(mo):\n    {c}\n    return\n\n\n"
            ));
        }
        s.push_str("if __name__ == \"__main__\":\n    app.run()\n");
        s
    }

    fn pieces<'a>(content: &'a [u8], lengths: &[usize]) -> Vec<&'a [u8]> {
        let mut at = 0;
        lengths
            .iter()
            .map(|n| {
                let p = &content[at..at + n];
                at += n;
                p
            })
            .collect()
    }

    #[test]
    fn a_marimo_notebook_is_cut_at_its_cells() {
        let cells: Vec<String> = (0..12)
            .map(|i| format!("mo.md(r\"\"\"{}\"\"\")", "x".repeat(300 + i)))
            .collect();
        let refs: Vec<&str> = cells.iter().map(String::as_str).collect();
        let text = marimo(&refs);
        assert_eq!(detect(text.as_bytes()), Format::Marimo);
        let lengths = chunk_lengths(text.as_bytes());
        assert_eq!(lengths.iter().sum::<usize>(), text.len());
        // Header, app line, twelve cells, main guard.
        assert_eq!(lengths.len(), 15, "{lengths:?}");
        let p = pieces(text.as_bytes(), &lengths);
        assert!(p[0].starts_with(b"# /// script") && p[1].starts_with(b"app = marimo.App("));
        assert!(p[2..14].iter().all(|c| c.starts_with(b"@app.cell")));
        assert!(p[14].starts_with(b"if __name__"));

        // Editing one cell changes exactly one chunk.
        let mut edited = refs.clone();
        let new = "mo.md(\"changed\")".to_string();
        edited[5] = &new;
        let text2 = marimo(&edited);
        let q = pieces(text2.as_bytes(), &chunk_lengths(text2.as_bytes()));
        assert_eq!(q.len(), 15);
        let differing = p.iter().zip(&q).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 1);
    }

    fn notebook(cells: &[String]) -> String {
        let body: Vec<String> = cells
            .iter()
            .map(|src| {
                format!(
                    "  {{\n   \"cell_type\": \"code\",\n   \"metadata\": {{}},\n   \"outputs\": \
                     [{{\"text\": [\"{{not a cell}} [\\\"]\"]}}],\n   \"source\": [\"{src}\"]\n  }}"
                )
            })
            .collect();
        format!(
            "{{\n \"metadata\": {{\"cells\": [{{\"x\": 1}}]}},\n \"cells\": [\n{}\n ],\n \
             \"nbformat\": 4\n}}\n",
            body.join(",\n")
        )
    }

    #[test]
    fn a_jupyter_notebook_is_cut_at_its_cell_objects() {
        let cells: Vec<String> = (0..10)
            .map(|i| format!("print({i}) # {}", "y".repeat(500)))
            .collect();
        let text = notebook(&cells);
        assert_eq!(detect(text.as_bytes()), Format::Jupyter);
        let lengths = chunk_lengths(text.as_bytes());
        assert_eq!(lengths.iter().sum::<usize>(), text.len());
        // Header (with the metadata's decoy "cells"), ten cells.
        assert_eq!(lengths.len(), 11, "{lengths:?}");
        let p = pieces(text.as_bytes(), &lengths);
        assert!(
            p[1..]
                .iter()
                .all(|c| c.starts_with(b"  {\n   \"cell_type\""))
        );
        let mut edited = cells.clone();
        edited[3] = "print('changed')".into();
        let text2 = notebook(&edited);
        let q = pieces(text2.as_bytes(), &chunk_lengths(text2.as_bytes()));
        assert_eq!(q.len(), 11);
        assert_eq!(p.iter().zip(&q).filter(|(a, b)| a != b).count(), 1);

        // Minified: cut at the brace.
        let mini: String = text.lines().map(str::trim).collect();
        let lengths = chunk_lengths(mini.as_bytes());
        let p = pieces(mini.as_bytes(), &lengths);
        assert_eq!(p.len(), 11);
        assert!(p[1..].iter().all(|c| c.starts_with(b"{\"cell_type\"")));
    }

    #[test]
    fn other_content_keeps_its_layout_or_gets_small_chunks() {
        let small = b"short text".repeat(100);
        assert_eq!(chunk_lengths(&small), vec![small.len()]);
        let mut binary = vec![7u8; 100_000];
        binary[10] = 0;
        assert_eq!(detect(&binary), Format::Binary);
        assert_eq!(chunk_lengths(&binary), vec![binary.len()]);
        let mut text = String::new();
        let mut x = 1u64;
        while text.len() < 200_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            text.push_str(&format!("line {} {}\n", x >> 40, x % 977));
        }
        assert_eq!(detect(text.as_bytes()), Format::Text);
        let lengths = chunk_lengths(text.as_bytes());
        assert_eq!(lengths.iter().sum::<usize>(), text.len());
        assert!(lengths.iter().all(|&n| n <= TEXT_MAX));
        assert!(lengths.len() >= 200_000 / TEXT_MAX);
        // Not a notebook: JSON without a top-level "cells" array.
        assert_eq!(detect(br#"{"a": {"cells": [{"x": 1}]}}"#), Format::Text);
    }

    #[test]
    fn a_large_cell_is_cut_further_and_any_input_reassembles() {
        let big = "z".repeat(300_000);
        let text = marimo(&["a = 1", &big, "b = 2"]);
        let lengths = chunk_lengths(text.as_bytes());
        assert_eq!(lengths.iter().sum::<usize>(), text.len());
        assert!(lengths.iter().all(|&n| n <= SEGMENT_MAX), "{lengths:?}");
        // Hostile shapes: unbalanced JSON, stray brackets, escapes at the end.
        for s in [
            "{\"cells\": [{".to_string() + &"{".repeat(9000),
            "{\"cells\": ]]]]".to_string() + &"}".repeat(9000),
            "{\"cells\": [\"\\".to_string() + &"\\".repeat(9000),
            "app = marimo.App(\n".repeat(2000),
        ] {
            let lengths = chunk_lengths(s.as_bytes());
            assert_eq!(lengths.iter().sum::<usize>(), s.len());
            assert!(lengths.iter().all(|&n| n > 0));
        }
    }
}
