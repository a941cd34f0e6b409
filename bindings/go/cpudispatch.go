package tether

// cpudispatch.go sets a module's CPU-features word (metadata "cpu_dispatch", docs/abi.md "CPU dispatch") with the
// rules of tether_rpc.cpu_features.dispatch_word: kernels compiled twice (e.g. android-arm64 with and without the
// Armv8.2 dot product) then take the version this CPU executes.

import (
	"log"
	"unsafe"
)

// dispatchWordSymbol is the exported uint32 a module with "cpu_dispatch" carries (0 after dlopen).
const dispatchWordSymbol = "tether_cpu_features"

// dispatchWord is the module's CPU-features word: bit i set when this CPU reports names[i] (the metadata list as
// JSON decoded it, first 32 entries; anything but a string names no feature), 0 when the CPU's features are unknown:
// every kernel then takes its base version, which runs on any CPU the module's "requires" admits.
func dispatchWord(names any, caps CPUCapabilities) uint32 {
	list, ok := names.([]any)
	if !ok || caps.Source == "" {
		return 0
	}
	have := map[string]bool{}
	for _, f := range caps.Features {
		have[f] = true
	}
	var word uint32
	for i, n := range list {
		if i >= 32 {
			break
		}
		if s, ok := n.(string); ok && have[s] {
			word |= 1 << uint(i)
		}
	}
	return word
}

// setDispatchWord writes dispatchWord into the freshly loaded library h when its metadata names bits, before any
// of its functions runs, and returns the word.
func setDispatchWord(h unsafe.Pointer, names any, caps CPUCapabilities, label string) uint32 {
	if names == nil {
		return 0
	}
	if list, ok := names.([]any); ok && len(list) == 0 {
		return 0
	}
	word := dispatchWord(names, caps)
	p := dlsym(h, dispatchWordSymbol)
	if p == nil { // bits named but no word: every kernel stays on its base version
		log.Printf("tether: %s: metadata cpu_dispatch %v but no %s symbol; using base kernels", label, names,
			dispatchWordSymbol)
		return 0
	}
	*(*uint32)(p) = word
	return word
}
