//go:build !mwrpcdebug && !race

package pool

// debug is true in a debug build (tag mwrpcdebug, or the race detector): see the package
// documentation for what it adds.
const debug = false
