//! PyYAML's leniency about indentation, on top of a YAML 1.2 scanner. PyYAML never checks indentation
//! inside a flow collection or a quoted scalar, so real configs close a list at their key's column or
//! below it (`layers: [` ... `]`) or break a quoted string onto a line at the margin; saphyr refuses both.
//! Such a line's leading white space is folded away either way, so indenting it past the bracket or quote
//! that opened its construct changes no value: the reader retries with the lines indented, and reports
//! every position as the file has it.

/// How many re-indents one file may need before its error is reported as it stands.
const MAX_REINDENTS: usize = 10_000;

/// How many bytes the retries of one file may parse in all. A line inside a flow collection whose
/// bracket the scanner does not name moved one space per retry, each a parse of the whole file: on a
/// file with a line thousands of characters wide that was thousands of parses (found by fuzzing: 4-30 KB
/// files, over 10 s each). At 2 MiB a 1 KB file of such lines still took 7 ms and slowed the fuzzer
/// ninefold; 256 KiB bounds any file to well under a millisecond of retries and is some 125 retries of a
/// 2 KB config (one per line closing a flow collection at the margin, or per quoted scalar broken there).
pub(super) const MAX_REINDENT_BYTES: usize = 256 << 10;

/// How far past the widest line of the file a line may be pushed: no re-indent PyYAML would accept needs
/// more (a line moves past a bracket or quote on some line of the file). Without this bound a line the
/// scanner keeps refusing was pushed one space further per try, each try a parse of the whole file
/// (found by fuzzing: minutes on a 60-byte file).
const PAST_WIDEST: usize = 4;

/// What the scanner refused that PyYAML accepts (lines and columns 1-based, in the text scanned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reindent {
    /// A line inside a flow collection: its first character must reach `col` (further each try when
    /// the opening bracket is not known).
    FlowLine { line: usize, col: Option<usize> },
    /// A quoted scalar opening at (`line`, `col`) with a continuation line at or left of its parent's
    /// indentation: every continuation line is moved past the quote.
    QuotedScalar { line: usize, col: usize },
}

/// `text` with the lines `reindent` names indented, the spaces added recorded per line in `pads`; `None`
/// when that cannot help (nothing to indent, or a document marker `---`/`...` at a line's start, which
/// PyYAML refuses inside a quoted scalar too).
pub(super) fn reindent(text: &str, pads: &mut Vec<usize>, reindent: Reindent) -> Option<String> {
    if pads.iter().sum::<usize>() > MAX_REINDENTS * 8 || pads.len() > MAX_REINDENTS {
        return None;
    }
    let (lines, col) = match reindent {
        Reindent::FlowLine { line, col } => {
            // Without the bracket's column: twice the spaces already added (1, 2, 4, ...), so a line
            // reaches the column it needs in a few parses, not one per space.
            let step = pads.get(line - 1).copied().unwrap_or(0).max(1);
            (
                line..=line,
                col.unwrap_or(indent_of(text, line)? + 1 + step),
            )
        }
        Reindent::QuotedScalar { line, col } => {
            (line + 1..=closing_quote_line(text, line, col)?, col + 1)
        }
    };
    let wanted = col - 1;
    let mut out = String::with_capacity(text.len() + wanted);
    let mut changed = false;
    for (index, piece) in text.split_inclusive('\n').enumerate() {
        if lines.contains(&(index + 1)) {
            let body = piece.trim_start_matches([' ', '\t']);
            let indent = piece.len() - body.len();
            if is_document_marker(body) {
                return None;
            }
            if indent < wanted && !body.trim().is_empty() {
                let pad = wanted - indent;
                if pads.len() <= index {
                    pads.resize(index + 1, 0);
                }
                if pads[index] + pad > widest(text, pads) + PAST_WIDEST {
                    return None;
                }
                pads[index] += pad;
                out.extend(std::iter::repeat_n(' ', pad));
                changed = true;
            }
        }
        out.push_str(piece);
    }
    changed.then_some(out)
}

/// The longest line's length in the file as written (`text` less the `pads` added), in bytes.
fn widest(text: &str, pads: &[usize]) -> usize {
    text.split('\n')
        .enumerate()
        .map(|(i, line)| line.len() - pads.get(i).copied().unwrap_or(0).min(line.len()))
        .max()
        .unwrap_or(0)
}

/// The number of spaces and tabs in front of 1-based `line`.
fn indent_of(text: &str, line: usize) -> Option<usize> {
    let piece = text.split_inclusive('\n').nth(line.checked_sub(1)?)?;
    Some(piece.len() - piece.trim_start_matches([' ', '\t']).len())
}

fn is_document_marker(body: &str) -> bool {
    ["---", "..."].iter().any(|m| {
        body.strip_prefix(m)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
    })
}

/// The line of the quote closing the quoted scalar whose opening quote is at (`line`, `col`): `''` is an
/// escaped quote in single quotes, `\` escapes the next character in double quotes.
fn closing_quote_line(text: &str, line: usize, col: usize) -> Option<usize> {
    let start = text
        .split_inclusive('\n')
        .take(line - 1)
        .map(str::len)
        .sum::<usize>();
    let rest = text.get(start..)?;
    let mut chars = rest.chars().skip(col - 1).peekable();
    let quote = chars.next().filter(|c| *c == '\'' || *c == '"')?;
    let mut at = line;
    while let Some(c) = chars.next() {
        match c {
            '\n' => at += 1,
            // An escaped character is never the closing quote; an escaped line break still ends a line.
            '\\' if quote == '"' => at += usize::from(chars.next() == Some('\n')),
            '\'' if quote == '\'' && chars.peek() == Some(&'\'') => {
                chars.next();
            }
            c if c == quote => return Some(at),
            _ => {}
        }
    }
    None
}
