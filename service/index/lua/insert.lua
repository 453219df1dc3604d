-- Index one shard's share of a batch and report what it shares with other tenants.
-- Contract: service/index/base.py (memory.py is the same logic in Python). Every key this
-- script touches starts with KEYS[1], whose hash tag pins the shard to one cluster slot.
--
-- KEYS[1]  shard base, e.g. bw:{<key id>:a7}:ix
-- ARGV[1]  current generation     ARGV[2] generations to read    ARGV[3] key TTL (s)
-- ARGV[4]  common: tenants with it in a prompt   ARGV[5] common: tenants with it at all
-- ARGV[6]  bucket bits in shard
-- ARGV[7]  records of 25 bytes, big-endian, in batch order:
--          batch pos u32, tenant u32, doc u32, kind u8, fingerprint 8 bytes, offset u32
-- Stored value per fingerprint: '*' once common, else 13-byte entries
--          tenant u32, doc u32, offset u32, kinds u8 (1 prompt, 2 response)
-- An entry's doc is the tenant's first prompt with the fingerprint, else its first response.
-- Returns flat groups of five integers: batch pos, other tenant, its doc, its kinds, count.

local base = KEYS[1]
local cur = tonumber(ARGV[1])
local gens = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local common_prompt = tonumber(ARGV[4])
local common_any = tonumber(ARGV[5])
local divisor = 2 ^ (16 - tonumber(ARGV[6]))
local records = ARGV[7]

local COMMON = '*'
local ENTRY = 13
local PROMPT, RESPONSE = 1, 2

local function bucket_key(gen, fp)
  local bucket = math.floor((string.byte(fp, 2) * 256 + string.byte(fp, 3)) / divisor)
  return base .. ':' .. gen .. ':' .. bucket
end

-- Fold entry (d, o, k) into e: kinds add up; a prompt doc replaces a response-only one.
local function fold(e, d, o, k)
  if e[3] == RESPONSE and bit.band(k, PROMPT) == PROMPT then e[1] = d; e[2] = o end
  e[3] = bit.bor(e[3], k)
end

local hits, order, touched = {}, {}, {}

for r = 1, #records, 25 do
  local pos, tenant, doc, kind, fp, offset = struct.unpack('>I4I4I4Bc8I4', records, r)
  local merged, tenants, common, current = {}, {}, false, nil
  local cur_key = bucket_key(cur, fp)
  for gen = cur - gens + 1, cur do
    local value = redis.call('HGET', (gen == cur) and cur_key or bucket_key(gen, fp), fp)
    if value then
      if gen == cur then current = value end
      if value == COMMON then common = true break end
      for i = 1, #value, ENTRY do
        local t, d, o, k = struct.unpack('>I4I4I4B', value, i)
        if merged[t] then fold(merged[t], d, o, k) else merged[t] = {d, o, k}; tenants[#tenants + 1] = t end
      end
    end
  end
  local senders = 0
  for _, t in ipairs(tenants) do
    if bit.band(merged[t][3], PROMPT) == PROMPT then senders = senders + 1 end
  end
  common = common or senders >= common_prompt or #tenants >= common_any
  local mine = merged[tenant]
  if not common then
    local self_prompt = mine and bit.band(mine[3], PROMPT) == PROMPT
    for _, t in ipairs(tenants) do
      local e = merged[t]
      -- A leak goes from a prompt to another tenant's response (memory.py's _counts).
      local hit
      if kind == RESPONSE then hit = bit.band(e[3], PROMPT) == PROMPT and not self_prompt
      else hit = e[3] == RESPONSE end
      if t ~= tenant and hit then
        local hk = pos .. ':' .. t .. ':' .. e[1] .. ':' .. e[3]
        local h = hits[hk]
        if h then h[5] = h[5] + 1 else
          hits[hk] = {pos, t, e[1], e[3], 1}
          order[#order + 1] = hk
        end
      end
    end
    -- Would this doc make it common?
    if not mine then
      common = #tenants + 1 >= common_any or (kind == PROMPT and senders + 1 >= common_prompt)
    elseif kind == PROMPT and bit.band(mine[3], PROMPT) == 0 then
      common = senders + 1 >= common_prompt
    end
  end
  -- Record this tenant in the current generation.
  local new_value = nil
  if common then
    if current ~= COMMON then new_value = COMMON end
  elseif not current then
    new_value = struct.pack('>I4I4I4B', tenant, doc, offset, kind)
  else
    local found = false
    for i = 1, #current, ENTRY do
      local t, d, o, k = struct.unpack('>I4I4I4B', current, i)
      if t == tenant then
        found = true
        local e = {d, o, k}
        fold(e, doc, offset, kind)
        if e[1] ~= d or e[3] ~= k then
          new_value = string.sub(current, 1, i - 1) .. struct.pack('>I4I4I4B', t, e[1], e[2], e[3])
            .. string.sub(current, i + ENTRY)
        end
        break
      end
    end
    if not found then new_value = current .. struct.pack('>I4I4I4B', tenant, doc, offset, kind) end
  end
  if new_value then
    redis.call('HSET', cur_key, fp, new_value)
    touched[cur_key] = true
  end
end

for key in pairs(touched) do redis.call('EXPIRE', key, ttl, 'NX') end

local out = {}
for _, hk in ipairs(order) do
  local h = hits[hk]
  for i = 1, 5 do out[#out + 1] = h[i] end
end
return out
