package blobstore

// Op names one Store method. Memory counts requests per Op and Faulty
// injects faults per Op.
type Op string

// The operations of Store.
const (
	OpStat         Op = "Stat"
	OpReadAt       Op = "ReadAt"
	OpList         Op = "List"
	OpPut          Op = "Put"
	OpStageBlock   Op = "StageBlock"
	OpCommitBlocks Op = "CommitBlocks"
	OpDelete       Op = "Delete"
	OpCopy         Op = "Copy"
	OpSetMetadata  Op = "SetMetadata"
	OpCheck        Op = "Check"
)

// AllOps returns every Op, in the order of the Store interface.
func AllOps() []Op {
	return []Op{OpStat, OpReadAt, OpList, OpPut, OpStageBlock, OpCommitBlocks,
		OpDelete, OpCopy, OpSetMetadata, OpCheck}
}
