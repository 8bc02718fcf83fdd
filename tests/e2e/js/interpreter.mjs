// The unmodified npm `@e2b/code-interpreter` against aenv's code interpreter server (run by
// tests/integration/interpreter/test_server.py, with URL its address): the SDK's debug mode
// reaches the server at `sandboxUrl`, as it would reach a sandbox's port 49999.
import { Sandbox } from '@e2b/code-interpreter'

const sbx = await Sandbox.connect('debug', { debug: true, sandboxUrl: process.env.URL })
const sum = await sbx.runCode('1+1')
const stdout = []
const printed = await sbx.runCode("print('from js')", { onStdout: (m) => stdout.push(m.line) })
const failed = await sbx.runCode('undefined_name')
const js = await sbx.runCode('[1, 2].map((x) => x * 21)[1]', { language: 'js' })
console.log(JSON.stringify({
  text: sum.text, count: printed.executionCount - sum.executionCount, stdout,
  error: failed.error?.name, js: js.text,
}))
