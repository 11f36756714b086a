//go:build !mwrpcdebug

package soft

// debugThreadDomains: without the mwrpcdebug build tag, overlapping posts to objects of
// one thread domain are counted (and reported by the race detector), not fatal.
const debugThreadDomains = false
