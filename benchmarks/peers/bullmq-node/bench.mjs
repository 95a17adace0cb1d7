// BullMQ on Node.js for `python -m benchmarks overhead` (benchmarks/overhead.py starts it).
//   node bench.mjs worker          a Worker with a no-op processor until SIGTERM
//   node bench.mjs add N CHUNK     N no-op jobs through Queue.addBulk, CHUNK per call; prints
//                                  {"t0_ms", "enqueue_ms", "cpu_us", "ids"} as one JSON line
// Settings come from the environment: BENCH_REDIS_URL (redis://host:port/db), BENCH_QUEUE,
// BENCH_CONCURRENCY. Retention is BullMQ's default (removeOnComplete/removeOnFail unset: every
// finished job is kept), so the benchmark reads each job's processedOn and finishedOn.
import { Queue, Worker } from 'bullmq';

const url = new URL(process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379/5');
const connection = {
  host: url.hostname, port: Number(url.port || 6379), db: Number(url.pathname.slice(1) || 0),
};
const queueName = process.env.BENCH_QUEUE ?? 'bench';
const [mode, ...args] = process.argv.slice(2);

if (mode === 'worker') {
  const concurrency = Number(process.env.BENCH_CONCURRENCY ?? 100);
  const worker = new Worker(queueName, async () => null, { connection, concurrency });
  await worker.waitUntilReady();
  console.log(`bullmq-node worker ready (bullmq, concurrency ${concurrency})`);
  const stop = async () => { await worker.close(); process.exit(0); };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
} else if (mode === 'add') {
  const [n, chunk] = args.map(Number);
  const queue = new Queue(queueName, { connection });
  await queue.waitUntilReady();
  const cpu0 = process.cpuUsage();
  const t0 = Date.now();
  const ids = [];
  for (let start = 0; start < n; start += chunk) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + chunk); i++) jobs.push({ name: 'noop', data: { i } });
    for (const job of await queue.addBulk(jobs)) ids.push(job.id);
  }
  const enqueueMs = Date.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  console.log(JSON.stringify({ t0_ms: t0, enqueue_ms: enqueueMs, cpu_us: cpu.user + cpu.system, ids }));
  await queue.close();
} else {
  console.error('usage: node bench.mjs worker | add N CHUNK');
  process.exit(2);
}
