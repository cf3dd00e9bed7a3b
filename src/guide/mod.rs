// The guide's text lives in the Markdown files beside this one, one per
// part, so that each stays short; rustdoc joins them into one page. Each
// explanation is written once, here, and the types' docs link to it.
#![doc = include_str!("calls.md")]
#![doc = include_str!("load.md")]
#![doc = include_str!("services.md")]
#![doc = include_str!("links.md")]
