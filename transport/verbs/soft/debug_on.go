//go:build mwrpcdebug

package soft

// debugThreadDomains: with the mwrpcdebug build tag, overlapping posts to objects of one
// thread domain panic.
const debugThreadDomains = true
