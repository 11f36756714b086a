package verbs

// Keys (lkey and rkey) are 32 bits: a 24-bit table index in the high bits and an 8-bit
// "key" in the low bits that the owner of a memory window may change on every bind, so
// that an old rkey stops working. This mirrors libibverbs' ibv_inc_rkey.

// IncRkey returns rkey with its low 8 bits incremented (wrapping at 256) and its index bits
// unchanged: IncRkey(0x123456FF) == 0x12345600. Use it to pick the rkey of the next type-2
// bind of a window.
func IncRkey(rkey uint32) uint32 {
	return (rkey &^ 0xff) | ((rkey + 1) & 0xff)
}

// KeyIndex returns the table-index part of an lkey or rkey.
func KeyIndex(key uint32) uint32 { return key >> 8 }

// Key8 returns the 8-bit variable part of an lkey or rkey.
func Key8(key uint32) uint8 { return uint8(key) }

// MakeKey builds a key from a table index (24 bits) and an 8-bit variable part.
func MakeKey(index uint32, key8 uint8) uint32 { return index<<8 | uint32(key8) }
