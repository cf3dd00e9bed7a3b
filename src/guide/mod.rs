// The guide's text lives in the Markdown files beside this one, one per
// part, so that each stays short; rustdoc joins them into one page. Each
// explanation is written once, here, and the types' docs link to it. The
// part before links.md ends with a link definition of its own: rustdoc
// joins the parts with one newline, and a definition cannot follow a
// paragraph's last line.
#![doc = include_str!("calls.md")]
#![doc = include_str!("load.md")]
#![doc = include_str!("services.md")]
#![doc = include_str!("operating.md")]
#![doc = include_str!("scaling.md")]
#![doc = include_str!("links.md")]
