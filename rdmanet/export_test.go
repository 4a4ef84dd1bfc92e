package rdmanet

// EndLateWatches ends the watches of connection requests that dials gave
// up on, and waits until they released their cm IDs, so that a test can
// count what is left open.
var EndLateWatches = endLateWatches
