// Package listing holds what a mount knows of its directories' names:
// listings cached for the listing timeout and kept in step with the
// mount's own changes (Cache), partial listings fed page by page by a
// directory pass, the merge of a flat page of blobs and prefixes into
// names of settled kind (PageMerger), and tree walks that list a whole
// tree flat when a walker (find, du, a data loader's index) descends it
// in order.
//
// It knows names and entries (package meta), not nodes or handles: the
// mount tells it of its changes (Set, Remove, Invalidate...) and gives a
// walk the names that exist only in the mount (StartWalks).
package listing
