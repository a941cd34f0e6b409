package tether

import "sync"

var hostFuncs sync.Map // name -> *hostFunc

type hostFunc struct{ name string }

func lookupHostFunc(name string) *hostFunc {
	v, ok := hostFuncs.Load(name)
	if !ok {
		return nil
	}
	return v.(*hostFunc)
}

func bindHostFunctions(m *Module) error { return nil }
