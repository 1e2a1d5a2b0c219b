"""The rigs the product is tested and shown with, outside the wheel: the crash harness
(`rig.crash`), the pipeline fakes (`rig.testing`) and the demo call (`rig.demo`)."""
